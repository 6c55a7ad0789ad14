package resilient_test

import (
	"context"
	"testing"
	"time"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/resilient"
	"github.com/charonlimit/charon/tiers"
)

// cachedStore returns a wrapper with "hot" cached as rejected for an hour.
func cachedStore(tb testing.TB) (*resilient.Store, *fakeRemote, []store.Item) {
	f := newFake()
	s := resilient.New(f, resilient.Options{})
	tb.Cleanup(func() { s.Close() })
	items := []store.Item{take(hourly, "hot", 1)}
	out := make([]tiers.Decision, 1)
	for range 51 {
		if err := s.Decide(context.Background(), t0, items, out); err != nil {
			tb.Fatal(err)
		}
	}
	if out[0].OK || f.calls.Load() != 51 {
		tb.Fatalf("setup: %+v after %d calls", out[0], f.calls.Load())
	}
	return s, f, items
}

func TestCacheHitAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	s, f, items := cachedStore(t)
	out := make([]tiers.Decision, 1)
	now := t0.Add(time.Second)
	allocs := testing.AllocsPerRun(1000, func() {
		if err := s.Decide(context.Background(), now, items, out); err != nil || out[0].OK {
			t.Fatal(err, out[0])
		}
	})
	if allocs != 0 || f.calls.Load() != 51 {
		t.Errorf("cache hit: %v allocations, %d remote calls; want 0 and 51", allocs, f.calls.Load())
	}
}

func BenchmarkCacheHit(b *testing.B) {
	s, _, items := cachedStore(b)
	out := make([]tiers.Decision, 1)
	now := t0.Add(time.Second)
	b.ReportAllocs()
	for b.Loop() {
		s.Decide(context.Background(), now, items, out)
	}
}

func BenchmarkCacheHitParallel(b *testing.B) {
	s, _, items := cachedStore(b)
	now := t0.Add(time.Second)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		out := make([]tiers.Decision, 1)
		for pb.Next() {
			s.Decide(context.Background(), now, items, out)
		}
	})
}

// BenchmarkRemote is the healthy path over an in-memory remote: the
// wrapper's own cost (deadline context, breaker, cache bookkeeping) on top.
func BenchmarkRemote(b *testing.B) {
	f := newFake()
	s := resilient.New(f, resilient.Options{})
	defer s.Close()
	items := []store.Item{take(&tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 1 << 40, Window: time.Hour, Active: tiers.Unbounded}}}, "k", 1)}
	out := make([]tiers.Decision, 1)
	b.ReportAllocs()
	now := t0
	for b.Loop() {
		now = now.Add(time.Microsecond)
		s.Decide(context.Background(), now, items, out)
	}
}
