package memstore_test

import (
	"context"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/internal/store/storetest"
	"github.com/charonlimit/charon/tiers"
)

var oneTier = &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 3, Window: time.Second, Active: tiers.Unbounded}}}

func item(domain string) store.Item {
	return store.Item{Key: store.Key{Resource: "r", Domain: domain, PolicyID: 1}, Policy: oneTier, Hits: 1, Min: 1}
}

func TestConformance(t *testing.T) {
	for _, shards := range []int{0, 1} {
		t.Run("shards="+strconv.Itoa(shards), func(t *testing.T) {
			storetest.Run(t, func(*testing.T) store.Store { return memstore.New(memstore.Options{Shards: shards}) })
		})
	}
}

func TestModelConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return new(storetest.Model) })
}

func TestMaxKeysEvictsLeastRecentlyUsed(t *testing.T) {
	s := memstore.New(memstore.Options{Shards: 1, MaxKeys: 2})
	defer s.Close()
	t0 := storetest.T0
	storetest.Decide(t, s, t0, item("a"))
	storetest.Decide(t, s, t0, item("b"))
	storetest.Decide(t, s, t0, item("a")) // a is now the most recent
	storetest.Decide(t, s, t0, item("c")) // evicts b
	if got := s.Evictions(); got != 1 {
		t.Fatalf("Evictions() = %d, want 1", got)
	}
	if got := s.Len(); got != 2 {
		t.Fatalf("Len() = %d, want 2", got)
	}
	// a kept its two hits: one more is granted, the next is not.
	if d := storetest.Decide(t, s, t0, item("a"), item("a")); d[0].OK {
		t.Errorf("a kept no history: %+v", d)
	}
	// A call needing more keys than the bound keeps them all while it runs.
	d := storetest.Decide(t, s, t0, item("x"), item("y"), item("z"))
	for i := range d {
		if !d[i].OK {
			t.Errorf("item %d rejected: %+v", i, d[i])
		}
	}
}

func TestUnboundedKeys(t *testing.T) {
	s := memstore.New(memstore.Options{Shards: 1, MaxKeys: -1})
	defer s.Close()
	for _, d := range []string{"a", "b", "c", "d", "e"} {
		storetest.Decide(t, s, storetest.T0, item(d))
	}
	if s.Evictions() != 0 || s.Len() != 5 {
		t.Fatalf("Evictions() = %d, Len() = %d; want 0 and 5", s.Evictions(), s.Len())
	}
}

func TestSweepForgetsAtForgetTime(t *testing.T) {
	s := memstore.New(memstore.Options{Shards: 4})
	defer s.Close()
	t0 := storetest.T0
	storetest.Decide(t, s, t0, item("a"))
	var st tiers.State
	tiers.Request(oneTier, &st, nil, t0, 1, 1)
	at := tiers.ForgetAt(oneTier, &st)
	if n := s.Sweep(at.Add(-time.Nanosecond)); n != 0 {
		t.Fatalf("Sweep before the forgetting time forgot %d keys, want 0", n)
	}
	if n := s.Sweep(at); n != 1 {
		t.Fatalf("Sweep at the forgetting time forgot %d keys, want 1", n)
	}
	if s.Len() != 0 || s.Expired() != 1 {
		t.Fatalf("Len() = %d, Expired() = %d; want 0 and 1", s.Len(), s.Expired())
	}
}

// TestSweepKeepsForeverState: a state tiers keep for ever (a tier above
// the first with an unbounded active period: a prison) is never swept; it
// was, its forgetting time overflowing nanoseconds, and the pair was back
// at tier 1 at the next sweep.
func TestSweepKeepsForeverState(t *testing.T) {
	prison := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{
		{Limit: 5, Window: time.Second, Active: tiers.Unbounded},
		{Limit: 1, Window: time.Hour, Active: tiers.Unbounded},
	}}
	s := memstore.New(memstore.Options{Shards: 1})
	defer s.Close()
	it := store.Item{Key: store.Key{Resource: "r", Domain: "bad", PolicyID: 1}, Policy: prison, Hits: 6, Min: 6}
	if d := storetest.Decide(t, s, storetest.T0, it)[0]; !d.OK || d.Tier != 2 {
		t.Fatalf("6 hits: %+v, want granted in tier 2", d)
	}
	var st tiers.State
	tiers.Request(prison, &st, nil, storetest.T0, 6, 6)
	if at := tiers.ForgetAt(prison, &st); !at.Equal(tiers.Forever) {
		t.Fatalf("ForgetAt = %v, want Forever", at)
	}
	later := storetest.T0.Add(2 * time.Second)
	if n := s.Sweep(later); n != 0 {
		t.Errorf("Sweep forgot %d keys kept for ever", n)
	}
	it.Hits, it.Min = 1, 1
	want := tiers.Peek(prison, &st, nil, later, 1, 1)
	if d := storetest.Decide(t, s, later, it)[0]; d.OK != want.OK || d.Tier != want.Tier {
		t.Errorf("after the sweep: OK %v in tier %d, want OK %v in tier %d (the prison's)", d.OK, d.Tier, want.OK, want.Tier)
	}
}

func TestSweeperGoroutineStops(t *testing.T) {
	now := storetest.T0
	s := memstore.New(memstore.Options{SweepInterval: time.Millisecond, Now: func() time.Time { return now }})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestZeroAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under -race")
	}
	s := memstore.New(memstore.Options{})
	defer s.Close()
	items := []store.Item{item("a")}
	out := make([]tiers.Decision, 1)
	ctx := context.Background()
	now := storetest.T0
	s.Decide(ctx, now, items, out)
	allocs := testing.AllocsPerRun(1000, func() {
		now = now.Add(time.Second)
		s.Decide(ctx, now, items, out)
	})
	if allocs > 0 {
		t.Errorf("Decide on a known key: %v allocs, want 0", allocs)
	}
}

// TestPairCost measures the live heap of 100,000 one-tier pairs (a per-user
// limit of 100 per minute, one hit each, the domain string allocated per
// request as the server does).
func TestPairCost(t *testing.T) {
	if raceEnabled || testing.Short() {
		t.Skip("heap figures are meaningless under -race")
	}
	const n = 100_000
	p := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 100, Window: time.Minute, Active: tiers.Unbounded}}}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s := memstore.New(memstore.Options{MaxKeys: -1})
	defer s.Close()
	items := make([]store.Item, 1)
	out := make([]tiers.Decision, 1)
	now := storetest.T0
	for i := range n {
		items[0] = store.Item{Key: store.Key{Resource: "api:user", Domain: "user=" + strconv.Itoa(1_000_000+i), PolicyID: 1}, Policy: p, Hits: 1, Min: 1}
		if err := s.Decide(context.Background(), now, items, out); err != nil || !out[0].OK {
			t.Fatalf("pair %d: %+v, %v", i, out[0], err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if f := os.Getenv("PAIR_HEAP_PROFILE"); f != "" {
		w, _ := os.Create(f)
		pprof.WriteHeapProfile(w)
		w.Close()
	}
	per := float64(after.HeapAlloc-before.HeapAlloc) / n
	t.Logf("reliability: a one-tier pair costs %.0f bytes of live heap", per)
	// memstore.PairBytes bounds it, so a change that makes pairs fatter is
	// seen (README: "What a pair costs") and KeysFor stays true.
	if per > memstore.PairBytes {
		t.Errorf("a one-tier pair costs %.0f bytes, more than %d", per, memstore.PairBytes)
	}
	runtime.KeepAlive(s)
}

func BenchmarkDecide(b *testing.B) {
	s := memstore.New(memstore.Options{})
	defer s.Close()
	p := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 1000, Window: time.Second, Active: tiers.Unbounded}}}
	keys := make([]store.Item, 10000)
	for i := range keys {
		keys[i] = store.Item{Key: store.Key{Resource: "r", Domain: string(rune('a'+i%26)) + strconv.Itoa(i), PolicyID: 1}, Policy: p, Hits: 1, Min: 1}
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		out := make([]tiers.Decision, 1)
		now := storetest.T0
		i := int(start.Add(7919))
		for pb.Next() {
			i++
			now = now.Add(time.Microsecond)
			s.Decide(context.Background(), now, keys[i%len(keys):i%len(keys)+1], out)
		}
	})
}

// start spreads the parallel benchmark goroutines over the keys.
var start atomic.Int64

// TestMillionValuesLiveHeap: a million distinct values through a store
// bounded to 10,000 keys leave a live heap of about 10,000 pairs, not a
// million: the store's part of the process's memory under such an attack
// (docs/performance.md, "Memory under a million values").
func TestMillionValuesLiveHeap(t *testing.T) {
	if raceEnabled || testing.Short() {
		t.Skip("heap figures are meaningless under -race")
	}
	const n, maxKeys = 1_000_000, 10_000
	p := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 100, Window: time.Minute, Active: tiers.Unbounded}}}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s := memstore.New(memstore.Options{MaxKeys: maxKeys})
	defer s.Close()
	items := make([]store.Item, 1)
	out := make([]tiers.Decision, 1)
	for i := range n {
		items[0] = store.Item{Key: store.Key{Resource: "api:user", Domain: "user=" + strconv.Itoa(1_000_000+i), PolicyID: 1}, Policy: p, Hits: 1, Min: 1}
		if err := s.Decide(context.Background(), storetest.T0, items, out); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	live := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("reliability: %d distinct values, --max-keys %d: %d keys, %d evictions, live heap %.1f MiB", n, maxKeys, s.Len(), s.Evictions(), float64(live)/(1<<20))
	if s.Len() > maxKeys+64 {
		t.Errorf("%d keys tracked, bound %d", s.Len(), maxKeys)
	}
	if live > maxKeys*memstore.PairBytes*2 {
		t.Errorf("live heap %d bytes for %d keys: more than %d per key", live, maxKeys, 2*memstore.PairBytes)
	}
	runtime.KeepAlive(s)
}

// BenchmarkPace compares a rejected decision alone with the same decision
// followed by its reservation and the reservation's give-back (what a paced
// request that gives up costs the store: two more calls; one that is
// granted costs the reservation alone).
func BenchmarkPace(b *testing.B) {
	p := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 1, Window: time.Hour, Active: tiers.Unbounded}}}
	for _, mode := range []string{"plain", "reserve+giveback"} {
		b.Run(mode, func(b *testing.B) {
			s := memstore.New(memstore.Options{})
			defer s.Close()
			ctx := context.Background()
			it := []store.Item{{Key: store.Key{Resource: "r", Domain: "d", PolicyID: 1}, Policy: p, Hits: 1, Min: 1}}
			out := make([]tiers.Decision, 1)
			t0 := storetest.T0
			_ = s.Decide(ctx, t0, it, out)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				now := t0.Add(time.Duration(i) * time.Microsecond)
				_ = s.Decide(ctx, now, it, out)
				if mode == "plain" {
					continue
				}
				at, _ := s.Reserve(ctx, now, out[0].RetryAfter+time.Hour, it, out)
				_ = s.GiveBack(ctx, now, at, it)
			}
		})
	}
}

func TestKeysFor(t *testing.T) {
	for _, c := range []struct {
		heap int64
		want int
	}{
		{0, memstore.DefaultMaxKeys},                             // no bound known
		{-1, memstore.DefaultMaxKeys},                            // the same
		{256 << 10, memstore.LeastKeys},                          // 512 would fit; raised to the least
		{512 << 20, 1 << 20},                                     // 512 MiB / 512 bytes
		{58 << 20, 58 << 11},                                     // half of a 128 MiB container's soft limit, about
		{1 << 40, memstore.DefaultMaxKeys},                       // capped
		{memstore.PairBytes * 5000, 5000},                        // exact
		{memstore.PairBytes*5000 + memstore.PairBytes - 1, 5000}, // rounded down: never more than fit
	} {
		if got := memstore.KeysFor(c.heap); got != c.want {
			t.Errorf("KeysFor(%d) = %d, want %d", c.heap, got, c.want)
		}
	}
}
