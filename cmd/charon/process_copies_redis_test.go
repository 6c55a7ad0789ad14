package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
	"github.com/charonlimit/charon/internal/redistest"
)

// TestRedisCopiesSurviveAKilledServer: 50 Session streams hold 1,000 copies
// through one `charon serve`, which is then killed with SIGKILL. A second
// server sharing the Redis grants no copy in the first seconds of the dead
// server's leases, and sees every copy free once the leases have run out.
func TestRedisCopiesSurviveAKilledServer(t *testing.T) {
	n := redistest.Single(t)
	bin := buildCharon(t)
	dir := t.TempDir()
	yaml := "domain: test\ndescriptors:\n  - key: seat\n    copies: {domain_limit: 1000}\n"
	if err := os.WriteFile(filepath.Join(dir, "test.yaml"), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"--config", dir, "--store", "redis", "--redis-url", "redis://" + n.Addr()}
	a := startServe(t, bin, args...)
	b := startServe(t, bin, args...)

	ctx := context.Background()
	dial := func(addr string) charonv1.CharonClient {
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return charonv1.NewCharonClient(cc)
	}
	res := &charonv1.Resource{Domain: "test", Entries: []*charonv1.Entry{{Key: "seat", Value: "s"}}}
	ca := dial(a.grpcAddr)
	for i := 0; i < 50; i++ {
		st, err := ca.Session(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(&charonv1.SessionRequest{Id: 1, Operation: &charonv1.SessionRequest_Reserve{
			Reserve: &charonv1.ReserveRequest{Resource: res, Copies: 20, MinCopies: 20}}}); err != nil {
			t.Fatal(err)
		}
		r, err := st.Recv()
		if err != nil || !r.GetReserve().GetOk() {
			t.Fatalf("session %d: reserve %v %v", i, r, err)
		}
	}
	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-a.exited
	killed := time.Now()

	cb := dial(b.grpcAddr)
	// probe asks for every copy, taking whatever is free (min) and giving it
	// straight back; it reports whether anything was granted.
	probe := func(min int64) bool {
		r, err := cb.Reserve(ctx, &charonv1.ReserveRequest{Resource: res, Copies: 1000, MinCopies: min, Session: "probe"})
		if err != nil {
			t.Fatalf("reserve on the survivor: %v", err)
		}
		if !r.GetOk() {
			return false
		}
		if _, err := cb.Release(ctx, &charonv1.ReleaseRequest{HoldId: r.GetHoldId()}); err != nil {
			t.Fatal(err)
		}
		return true
	}
	// Each session renews its own leases every lease/3 (3.3 s), so its
	// holds outlive the kill by about 6.7 s or more: nothing may be granted
	// for the first 3 s (slack for renewals a busy machine delayed). The
	// sessions renewed independently, so their holds lapse one session at a
	// time; all must be gone within the lease and the reaper's sweeps (30 s
	// here: slack for a busy machine).
	first := time.Duration(-1)
	for {
		since := time.Since(killed)
		if first < 0 && probe(1) {
			first = since
			if first < 3*time.Second {
				t.Fatalf("a copy was granted %.1fs after the kill, while the dead server's leases still ran", first.Seconds())
			}
		}
		if first >= 0 && probe(1000) {
			t.Logf("reliability: a killed server's 1,000 copies on Redis (lease 10 s): first copy free %.1fs, every copy free %.1fs after the kill", first.Seconds(), time.Since(killed).Seconds())
			return
		}
		if since > 30*time.Second {
			t.Fatalf("copies still held %.1fs after the kill (lease 10s)", since.Seconds())
		}
		time.Sleep(100 * time.Millisecond)
	}
}
