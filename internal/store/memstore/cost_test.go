package memstore_test

import (
	"context"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"testing"
	"time"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/internal/store/storetest"
	"github.com/charonlimit/charon/tiers"
)

// pairBytes is the heap one tracked one-tier pair costs, bounded here so a
// change that makes pairs fatter is seen (README: "What a pair costs").
const pairBytes = 512

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
	if per > pairBytes {
		t.Errorf("a one-tier pair costs %.0f bytes, more than %d", per, pairBytes)
	}
	runtime.KeepAlive(s)
}
