package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
)

// TestReserveProcessKilled runs the real binary: a `charon reserve` holding
// every copy is killed with SIGKILL; the server sees its stream die and the
// copies are free again.
func TestReserveProcessKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildCharon(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "c.yaml"), []byte("domain: c\ndescriptors:\n  - key: db\n    copies:\n      domain_limit: 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := freePorts(t, 3)
	grpcAddr := "127.0.0.1:" + strconv.Itoa(p[0])
	var serveErr bytes.Buffer
	serve := exec.Command(bin, "serve", "--config", dir, "--grpc-addr", grpcAddr,
		"--http-addr", "127.0.0.1:"+strconv.Itoa(p[1]), "--debug-addr", "127.0.0.1:"+strconv.Itoa(p[2]))
	serve.Stderr = &serveErr
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		serve.Process.Signal(syscall.SIGINT)
		serve.Wait()
	})

	cc, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	c := charonv1.NewCharonClient(cc)
	reserve3 := func() (*charonv1.ReserveResponse, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return c.Reserve(ctx, &charonv1.ReserveRequest{Resource: &charonv1.Resource{Domain: "c", Entries: []*charonv1.Entry{{Key: "db", Value: "a"}}}, Copies: 3, MinCopies: 3})
	}
	poll := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s\n%s", what, serveErr.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	poll("the server", func() bool {
		r, err := reserve3()
		if err == nil && r.Ok {
			c.Release(context.Background(), &charonv1.ReleaseRequest{HoldId: r.HoldId})
		}
		return err == nil && r.Ok
	})

	var out syncBuffer
	holder := exec.Command(bin, "reserve", "--addr", grpcAddr, "--domain", "c", "--descriptor", "db=a", "--copies", "3")
	holder.Stdout = &out
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, &out, "holding until interrupted")
	if r, err := reserve3(); err != nil || r.Ok {
		t.Fatalf("reserve while the holder runs: %v, %v", r, err)
	}
	holder.Process.Kill()
	holder.Wait()
	start := time.Now()
	var got *charonv1.ReserveResponse
	poll("the killed holder's copies", func() bool {
		r, err := reserve3()
		got = r
		return err == nil && r.Ok
	})
	t.Logf("reliability: copies free %v after SIGKILL of the holder", time.Since(start))
	c.Release(context.Background(), &charonv1.ReleaseRequest{HoldId: got.HoldId})
}
