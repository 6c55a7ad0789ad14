package storetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/tiers"
)

// Policies of the pacing tests: one tier with a hard limit, a bucket.
var (
	pacedHard = &tiers.Policy{Kind: tiers.KindTiers, HardLimit: 4, Tiers: []tiers.Tier{{Limit: 6, Window: 2 * time.Second, Active: tiers.Unbounded}}}
	pacedBig  = &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 100, Window: time.Second, Active: tiers.Unbounded}}}
)

// testPaceTraces replays random plain requests, reservations of the
// rejected ones (at their RetryAfter, when within 3 s) and give-backs of
// pending reservations on s and on the Model, and demands identical
// decisions: a store reserves exactly as store.ApplyReserve.
func testPaceTraces(t *testing.T, s store.Store) {
	rs, ok := s.(store.Reserver)
	if !ok {
		t.Skip("not a store.Reserver")
	}
	ctx := context.Background()
	m := &Model{}
	rng := rand.New(rand.NewPCG(7, 28))
	policies := []*tiers.Policy{simple, global, bucket, fixed, pacedHard, pacedBig, penalty, hourly}
	type pending struct {
		at    time.Time
		items []store.Item
	}
	var waits []pending
	var reserved, gaveBack int
	now := T0
	compare := func(step int, what string, items []store.Item, got, want []tiers.Decision) {
		t.Helper()
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("step %d (%s) at +%v, items %+v (-model +store):\n%s", step, what, now.Sub(T0), items, diff)
		}
	}
	for step := range 1200 {
		now = now.Add(time.Duration(rng.IntN(60)) * 10 * time.Millisecond)
		if len(waits) > 0 && rng.IntN(6) == 0 {
			// A wait given up: its reservation back, at its instant.
			i := rng.IntN(len(waits))
			w := waits[i]
			waits = slices.Delete(waits, i, i+1)
			if !w.at.After(now) {
				continue
			}
			if err := rs.GiveBack(ctx, now, w.at, w.items); err != nil {
				t.Fatalf("step %d: give back: %v", step, err)
			}
			if err := m.GiveBack(ctx, now, w.at, w.items); err != nil {
				t.Fatal(err)
			}
			gaveBack++
			continue
		}
		n := 1 + rng.IntN(2)
		items := make([]store.Item, n)
		for i := range items {
			pi := rng.IntN(len(policies))
			hits := int64(1 + rng.IntN(3))
			items[i] = take(policies[pi], fmt.Sprint("r", pi), fmt.Sprint("d", rng.IntN(2)), hits)
		}
		got, want := make([]tiers.Decision, n), make([]tiers.Decision, n)
		if err := s.Decide(ctx, now, items, got); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		if err := m.Decide(ctx, now, items, want); err != nil {
			t.Fatal(err)
		}
		compare(step, "decide", items, got, want)
		var wait time.Duration
		all := true
		for _, d := range want {
			all = all && d.OK
			if !d.OK {
				wait = max(wait, d.RetryAfter)
			}
		}
		if all || wait > 3*time.Second {
			continue
		}
		if rng.IntN(4) == 0 {
			wait += time.Duration(rng.IntN(300)) * time.Millisecond
		}
		at, err := rs.Reserve(ctx, now, wait, items, got)
		if err != nil {
			t.Fatalf("step %d: reserve: %v", step, err)
		}
		if want := now.Add(wait); !at.Equal(want) {
			t.Fatalf("step %d: reserved for %v, want %v", step, at, want)
		}
		if _, err := m.Reserve(ctx, now, wait, items, want); err != nil {
			t.Fatal(err)
		}
		compare(step, fmt.Sprintf("reserve +%v", wait), items, got, want)
		all = true
		for _, d := range want {
			all = all && d.OK
		}
		if all {
			waits = append(waits, pending{now.Add(wait), items})
			reserved++
		}
	}
	if reserved < 50 || gaveBack < 10 {
		t.Fatalf("the trace reserved %d times and gave back %d: too few to test pacing", reserved, gaveBack)
	}
}

// testPaceConcurrent: workers send a burst of paced requests at one
// instant on one key of 3 per second; each rejected request is reserved at
// its RetryAfter (again at the refusal's, when another took the slot).
// Every request is granted, at most 3 in any second of the instants they
// are answered at, and the answers fill the seconds one after another.
func testPaceConcurrent(t *testing.T, s store.Store) {
	rs, ok := s.(store.Reserver)
	if !ok {
		t.Skip("not a store.Reserver")
	}
	const n = 24
	var mu sync.Mutex
	var answers []time.Duration
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			it := []store.Item{take(simple, "paced", "hot", 1)}
			out := make([]tiers.Decision, 1)
			if err := s.Decide(context.Background(), T0, it, out); err != nil {
				errs <- err
				return
			}
			var wait time.Duration
			for try := 0; !out[0].OK; try++ {
				if try == n || out[0].RetryAfter == tiers.Unbounded {
					errs <- fmt.Errorf("worker %d: not reserved after %d tries: %+v", w, try, out[0])
					return
				}
				wait += out[0].RetryAfter
				if _, err := rs.Reserve(context.Background(), T0, wait, it, out); err != nil {
					errs <- err
					return
				}
			}
			mu.Lock()
			answers = append(answers, wait)
			mu.Unlock()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	slices.Sort(answers)
	for i, a := range answers {
		if want := time.Duration(i/3) * time.Second; a != want {
			t.Fatalf("answer %d at +%v, want +%v: %v", i, a, want, answers)
		}
	}
}
