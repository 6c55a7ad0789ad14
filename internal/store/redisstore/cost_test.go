package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/charonlimit/charon/internal/redistest"
	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/tiers"
)

// TestScriptCostBench logs Redis's own time per FCALL (INFO commandstats)
// for the load benchmark's policy (scripts/bench-redis.sh: one tier of 1000
// per second, active unbounded, no hard or global limit), one item per
// call, the Redis clock, over 10,000 domains whose states are present:
// every domain is hit once first, then 8 callers in parallel send 40,000
// calls to random domains. It logs the best of several rounds, the machine
// being noisy; CHARON_COST_ROUNDS sets their number (default 5). A
// measurement, not a check: it runs only with CHARON_COST_ROUNDS set.
func TestScriptCostBench(t *testing.T) {
	if os.Getenv("CHARON_COST_ROUNDS") == "" {
		t.Skip("a measurement of 10+ s: set CHARON_COST_ROUNDS (e.g. 5) to run it")
	}
	n, c := singleClient(t)
	s := testStore(t, c, Options{})
	ctx := context.Background()
	if err := s.Load(ctx); err != nil {
		t.Fatal(err)
	}
	p := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 1000, Window: time.Second, Active: tiers.Unbounded}}}
	const domains, calls, workers = 10000, 40000, 8
	items := make([]store.Item, domains)
	for i := range items {
		items[i] = store.Item{Key: store.Key{Resource: "bench/key=value", Domain: fmt.Sprint("user", i), PolicyID: 1}, Policy: p, Hits: 1, Min: 1}
	}
	out := make([]tiers.Decision, 1)
	decide := func(i int) {
		if err := s.Decide(ctx, time.Time{}, items[i:i+1], out); err != nil {
			t.Fatal(err)
		}
		if !out[0].OK {
			t.Fatalf("domain %d rejected: %+v", i, out[0])
		}
	}
	for i := range domains {
		decide(i)
	}
	rounds := 5
	if v := os.Getenv("CHARON_COST_ROUNDS"); v != "" {
		fmt.Sscan(v, &rounds)
	}
	best := 0.0
	for round := range rounds {
		if _, err := redistest.CLI(n.Port, "config", "resetstat"); err != nil {
			t.Fatal(err)
		}
		// Callers in parallel, as under load, so that Redis is kept busy.
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				r := rand.New(rand.NewPCG(uint64(round), uint64(w)))
				out := make([]tiers.Decision, 1)
				for range calls / workers {
					i := r.IntN(domains)
					if err := s.Decide(ctx, time.Time{}, items[i:i+1], out); err != nil {
						t.Error(err)
						return
					}
					if !out[0].OK {
						t.Errorf("domain %d rejected: %+v", i, out[0])
						return
					}
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		us, ok := fcallMicros(n.Port)
		if !ok {
			t.Fatal("no FCALL in INFO commandstats")
		}
		t.Logf("round: %.2f µs per FCALL", us)
		if best == 0 || us < best {
			best = us
		}
	}
	t.Logf("Redis time per FCALL, 1000/s policy, 10,000 domains: best %.2f µs", best)
}
