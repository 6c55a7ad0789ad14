// Package servertest starts a Charon server in process for the tests of
// its clients.
package servertest

import (
	"bytes"
	"context"
	"sync"
	"testing"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/copystore/memcopy"
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/internal/holds"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/server"
	"github.com/charonlimit/charon/service/charon"
	"github.com/charonlimit/charon/service/rls"
	"github.com/charonlimit/charon/tiers"
)

// CopyServer serves charon.v1 and RLS on a free loopback port over one
// copy-limited resource, domain "c" key "db" with 3 copies per domain, on
// the memory copy store it returns, and one rate-limited resource, key
// "banned" (requests_per_unit 0 per minute: every request is OVER_LIMIT),
// and one calendar quota, key "plan" (10 a year, UTC); the test's cleanup
// stops both.
func CopyServer(t testing.TB) (addr string, copies *memcopy.Store) {
	t.Helper()
	copies = memcopy.New(memcopy.Options{})
	t.Cleanup(func() { copies.Close() })
	rates := memstore.New(memstore.Options{})
	t.Cleanup(func() { rates.Close() })
	eng := engine.New(engine.Options{Store: rates})
	tree, err := descriptors.NewTree([]descriptors.DomainSpec{{Config: descriptors.DomainConfig{Name: "c"}, Nodes: []*descriptors.Node{
		{Key: "db", Limit: &descriptors.Limit{Copies: &descriptors.Copies{DomainLimit: 3}}},
		{Key: "banned", Limit: &descriptors.Limit{Policy: &tiers.Policy{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Unit: tiers.UnitMinute}}}},
		{Key: "plan", Limit: &descriptors.Limit{Quota: &tiers.Policy{Kind: tiers.KindQuota, Quota: tiers.Quota{Limit: 10, Period: tiers.PeriodYear}}}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	eng.SetTree(tree)
	broker := holds.New(holds.Options{Copies: copies, Tree: eng.Tree})
	srv, err := server.New(server.Options{GRPCAddr: "127.0.0.1:0", Engine: eng}, rls.New(eng, rls.Options{}), charon.New(eng, broker, charon.Options{}))
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

// Buffer is a bytes.Buffer safe for a process or command writing while a
// test reads.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
