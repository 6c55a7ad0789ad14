package loadgen

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/copystore/memcopy"
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/server"
)

// TestMain fails the package's tests if any goroutine outlives them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// startCopyServer serves charon.v1 over a copy-limited resource c/db (limit
// 3) on a free port.
func startCopyServer(t *testing.T) (string, *memcopy.Store) {
	t.Helper()
	copies := memcopy.New(memcopy.Options{})
	t.Cleanup(func() { copies.Close() })
	eng := engine.New(engine.Options{Copies: copies})
	tree, err := descriptors.NewTree([]descriptors.DomainSpec{{Config: descriptors.DomainConfig{Name: "c"}, Nodes: []*descriptors.Node{
		{Key: "db", Limit: &descriptors.Limit{Copies: &descriptors.Copies{DomainLimit: 3}}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	eng.SetTree(tree)
	srv, err := server.New(server.Options{GRPCAddr: "127.0.0.1:0", Engine: eng})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return srv.GRPCAddr(), copies
}

// TestReservePairs drives reserve+release pairs, on Session streams and as
// unary calls, against an in-process server: pairs complete without errors,
// and every copy reserved is released by the end.
func TestReservePairs(t *testing.T) {
	for _, unary := range []bool{false, true} {
		addr, copies := startCopyServer(t)
		r, err := Run(Options{Addr: addr, Concurrency: 4, Conns: 1, Duration: 300 * time.Millisecond,
			Warmup: 50 * time.Millisecond, Domain: "c", Key: "db", Descriptors: 1, Keys: 1, Reserve: true, Unary: unary})
		if err != nil {
			t.Fatal(err)
		}
		if r.Requests == 0 || r.Errors != 0 {
			t.Fatalf("unary %v: requests %d errors %d (first %v), want some and none", unary, r.Requests, r.Errors, r.FirstError)
		}
		if st := copies.Stats(); st.Copies != 0 || st.Holds != 0 {
			t.Fatalf("unary %v: after the run %d copies in %d holds still held", unary, st.Copies, st.Holds)
		}
	}
}
