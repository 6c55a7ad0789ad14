package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
	"github.com/charonlimit/charon/internal/servertest"
)

// TestReserveProcessKilled runs the real binary: a `charon reserve` holding
// every copy is killed with SIGKILL; the server sees its stream die and the
// copies are free again. Then one is paused with SIGSTOP: the server's
// unanswered pings end its session (about 10 s), and the resumed holder
// says so and exits 1.
func TestReserveProcessKilled(t *testing.T) {
	bin := buildCharon(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "c.yaml"), []byte("domain: c\ndescriptors:\n  - key: db\n    copies:\n      domain_limit: 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	addrs := freeAddrs(t, 3)
	grpcAddr := addrs[0]
	var serveErr servertest.Buffer
	serve := exec.Command(bin, "serve", "--config", dir, "--grpc-addr", grpcAddr,
		"--http-addr", addrs[1], "--debug-addr", addrs[2])
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

	// holder starts a `charon reserve` of every copy and waits until it
	// holds them.
	holder := func() (*exec.Cmd, *servertest.Buffer) {
		out := new(servertest.Buffer)
		cmd := exec.Command(bin, "reserve", "--addr", grpcAddr, "--domain", "c", "--descriptor", "db=a", "--copies", "3")
		cmd.Stdout = out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		poll("the holder", func() bool { return strings.Contains(out.String(), "holding until interrupted") })
		return cmd, out
	}
	killed, _ := holder()
	if r, err := reserve3(); err != nil || r.Ok {
		t.Fatalf("reserve while the holder runs: %v, %v", r, err)
	}
	killed.Process.Kill()
	killed.Wait()
	start := time.Now()
	var got *charonv1.ReserveResponse
	poll("the killed holder's copies", func() bool {
		r, err := reserve3()
		got = r
		return err == nil && r.Ok
	})
	t.Logf("reliability: copies free %v after SIGKILL of the holder", time.Since(start))
	c.Release(context.Background(), &charonv1.ReleaseRequest{HoldId: got.HoldId})

	// A paused holder (SIGSTOP) does not answer the server's pings: the
	// server ends its session and frees the copies; resumed, the holder
	// says its hold is gone and exits 1.
	paused, out2 := holder()
	if err := paused.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	deadline := time.Now().Add(90 * time.Second)
	for {
		if r, err := reserve3(); err == nil && r.Ok {
			c.Release(context.Background(), &charonv1.ReleaseRequest{HoldId: r.HoldId})
			break
		}
		if time.Now().After(deadline) {
			paused.Process.Kill()
			t.Fatalf("a paused holder's copies still held after 90 s\n%s", serveErr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("reliability: copies free %v after SIGSTOP of the holder", time.Since(start))
	paused.Process.Signal(syscall.SIGCONT)
	exited := make(chan error, 1)
	go func() { exited <- paused.Wait() }()
	select {
	case err := <-exited:
		if err == nil || !strings.Contains(out2.String(), "the session ended") {
			t.Errorf("resumed holder: exit %v, output %q; want exit 1 saying the session ended", err, out2.String())
		}
	case <-time.After(60 * time.Second):
		paused.Process.Kill()
		t.Errorf("the resumed holder did not notice its session had ended; output %q", out2.String())
	}
}
