package memstore_test

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/charonlimit/charon/internal/statefile"
	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/internal/store/storetest"
	"github.com/charonlimit/charon/tiers"
)

// restartPolicies cover every kind of state: burst tiers with hard and
// global limits, a token bucket, a fixed window and a calendar quota.
var restartPolicies = []*tiers.Policy{
	{Kind: tiers.KindTiers, HardLimit: 6, GlobalLimit: 9, Tiers: []tiers.Tier{
		{Limit: 3, Window: time.Second, Active: 10 * time.Second, Cooldown: 5 * time.Second},
		{Limit: 5, Window: time.Second, Active: tiers.Unbounded},
	}},
	{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 100, Window: time.Minute, Active: tiers.Unbounded}}}, // bucketed log
	{Kind: tiers.KindTokenBucket, Bucket: tiers.TokenBucket{Capacity: 5, Refill: 2, Per: time.Second}},
	{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Limit: 4, Unit: tiers.UnitSecond}},
	{Kind: tiers.KindQuota, Quota: tiers.Quota{Limit: 40, Period: tiers.PeriodDay}},
}

// TestRestoreDecidesAsWithoutRestart: a store restored from a state file
// (through statefile's encoding) decides a random trace exactly as the
// store that never stopped, on the same clock, whatever the instant of the
// restart; states whose window passed before the restart are not restored.
func TestRestoreDecidesAsWithoutRestart(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 28))
			type step struct {
				at    time.Time
				items []store.Item
			}
			var trace []step
			now := storetest.T0
			for range 400 {
				now = now.Add(time.Duration(rng.IntN(300)) * time.Millisecond)
				var items []store.Item
				for range 1 + rng.IntN(2) {
					p := rng.IntN(len(restartPolicies))
					hits := int64(1 + rng.IntN(2))
					items = append(items, store.Item{Key: store.Key{Resource: "r" + strconv.Itoa(p), Domain: "d" + strconv.Itoa(rng.IntN(4)), PolicyID: uint64(p + 1)},
						Policy: restartPolicies[p], Hits: hits, Min: hits})
				}
				trace = append(trace, step{now, items})
			}
			cut := rng.IntN(len(trace))
			live := memstore.New(memstore.Options{})
			defer live.Close()
			before := memstore.New(memstore.Options{})
			defer before.Close()
			decide := func(s store.Store, st step) []tiers.Decision {
				return storetest.Decide(t, s, st.at, st.items...)
			}
			for _, st := range trace[:cut] {
				decide(live, st)
				decide(before, st)
			}
			// The restart: a snapshot at the last decision, restored a
			// moment later.
			at := storetest.T0
			if cut > 0 {
				at = trace[cut-1].at
			}
			path := filepath.Join(t.TempDir(), "state")
			if err := statefile.Write(path, at.UnixMicro(), before.Snapshot(at)); err != nil {
				t.Fatal(err)
			}
			recs, _, err := statefile.Read(path)
			if err != nil {
				t.Fatal(err)
			}
			after := memstore.New(memstore.Options{})
			defer after.Close()
			restored := after.Restore(at, recs)
			if restored != len(recs) || after.Len() != restored {
				t.Errorf("restored %d of %d records, %d keys", restored, len(recs), after.Len())
			}
			for i, st := range trace[cut:] {
				want, got := decide(live, st), decide(after, st)
				if diff := cmp.Diff(want, got); diff != "" {
					t.Fatalf("step %d after the restart at step %d (-without restart +restored):\n%s", cut+i, cut, diff)
				}
			}
		})
	}
}

// TestRestoreDropsPassedWindows: a state whose forgetting time passed while
// the process was down is not restored; one still counting is.
func TestRestoreDropsPassedWindows(t *testing.T) {
	minute := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 1, Window: time.Minute, Active: tiers.Unbounded}}}
	day := &tiers.Policy{Kind: tiers.KindQuota, Quota: tiers.Quota{Limit: 1, Period: tiers.PeriodDay}}
	t0 := time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC)
	s := memstore.New(memstore.Options{})
	defer s.Close()
	storetest.Decide(t, s, t0, store.Item{Key: store.Key{Resource: "m", Domain: "a", PolicyID: 1}, Policy: minute, Hits: 1, Min: 1})
	storetest.Decide(t, s, t0, store.Item{Key: store.Key{Resource: "q", Domain: "a", PolicyID: 2}, Policy: day, Hits: 1, Min: 1})
	recs := s.Snapshot(t0)
	if len(recs) != 2 {
		t.Fatalf("snapshot of 2 states: %d records", len(recs))
	}
	later := t0.Add(2 * time.Minute)
	r := memstore.New(memstore.Options{})
	defer r.Close()
	if n := r.Restore(later, recs); n != 1 {
		t.Fatalf("restored %d states two minutes later, want 1 (the day's quota)", n)
	}
	if d := storetest.Decide(t, r, later, store.Item{Key: store.Key{Resource: "q", Domain: "a", PolicyID: 2}, Policy: day, Hits: 1, Min: 1}); d[0].OK {
		t.Errorf("the day's quota was granted again after the restart: %+v", d[0])
	}
	if d := storetest.Decide(t, r, later, store.Item{Key: store.Key{Resource: "m", Domain: "a", PolicyID: 1}, Policy: minute, Hits: 1, Min: 1}); !d[0].OK {
		t.Errorf("the minute's window passed, yet: %+v", d[0])
	}
}

// TestRestoreKeepsRecency: a restored store evicts in the order the
// snapshotted one would have, least recently used first.
func TestRestoreKeepsRecency(t *testing.T) {
	s := memstore.New(memstore.Options{Shards: 1, MaxKeys: 3})
	defer s.Close()
	for _, d := range []string{"a", "b", "c", "a"} { // least recent: b
		storetest.Decide(t, s, storetest.T0, item(d))
	}
	r := memstore.New(memstore.Options{Shards: 1, MaxKeys: 3})
	defer r.Close()
	r.Restore(storetest.T0, s.Snapshot(storetest.T0))
	storetest.Decide(t, r, storetest.T0, item("d")) // evicts b
	for _, d := range []string{"a", "c"} {
		if v, _ := r.Inspect(context.Background(), storetest.T0, &store.Item{Key: item(d).Key, Policy: oneTier}); v.Remaining == oneTier.Tiers[0].Limit {
			t.Errorf("%s was evicted, want b (the least recently used)", d)
		}
	}
}
