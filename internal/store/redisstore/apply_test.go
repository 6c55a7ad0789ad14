package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/internal/store/storetest"
	"github.com/charonlimit/charon/tiers"
)

// randDur returns a random duration in whole µs in [lo, hi).
func randDur(r *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(r.Int64N(int64(hi-lo)/1000))*time.Microsecond
}

// randScale returns the range of a random window or period: milliseconds
// to seconds mostly, else minutes to an hour, or hours to days, so that
// long windows, active periods and cooldowns (and the bucket widths of
// long windows) are exercised as well.
func randScale(r *rand.Rand) (lo, hi time.Duration) {
	switch r.IntN(6) {
	case 0:
		return time.Minute, time.Hour
	case 1:
		return time.Hour, 3 * 24 * time.Hour
	}
	return time.Millisecond, 3 * time.Second
}

// randPolicy returns a random valid, normalized policy of any kind, with
// limits on both sides of the bucketed threshold (64) and windows and
// periods from milliseconds to days.
func randPolicy(r *rand.Rand) *tiers.Policy {
	for {
		var p tiers.Policy
		switch k := r.IntN(10); {
		case k < 6:
			p.Kind = tiers.KindTiers
			n := r.IntN(4)
			if r.IntN(20) == 0 {
				n = 0 // closed
			}
			for i := range n {
				var t tiers.Tier
				switch r.IntN(3) {
				case 0:
					t.Limit = 1 + r.Int64N(8)
				case 1:
					t.Limit = 1 + r.Int64N(70)
				default:
					t.Limit = 60 + r.Int64N(300)
				}
				lo, hi := randScale(r)
				t.Window = randDur(r, lo, hi)
				if i == 0 && r.IntN(2) == 0 {
					t.Active = tiers.Unbounded
				} else {
					t.Active = t.Window * time.Duration(1+r.IntN(5))
					if r.IntN(10) == 0 {
						t.Active = tiers.Unbounded
					}
				}
				switch r.IntN(4) {
				case 0:
				case 1:
					t.Cooldown = randDur(r, time.Microsecond, hi*5/3)
				case 2:
					t.Cooldown = t.Window * time.Duration(r.IntN(4))
				default:
					if r.IntN(5) == 0 {
						t.Cooldown = tiers.Unbounded
					}
				}
				t.Skippable = r.IntN(3) == 0
				p.Tiers = append(p.Tiers, t)
			}
			if r.IntN(3) == 0 {
				p.HardLimit = 1 + r.Int64N(100)
			}
			if r.IntN(3) == 0 {
				p.GlobalLimit = 1 + r.Int64N(150)
			}
			if r.IntN(4) == 0 && n >= 1 {
				// A concurrency limit: one tier of slots, active for ever.
				p.Tiers = p.Tiers[:1]
				p.Tiers[0].Active, p.Tiers[0].Cooldown = tiers.Unbounded, 0
				p.HardLimit, p.GlobalLimit, p.Concurrency = 0, 0, true
			}
		case k < 8:
			p.Kind = tiers.KindTokenBucket
			_, hi := randScale(r)
			p.Bucket = tiers.TokenBucket{Capacity: 1 + r.Int64N(200), Refill: 1 + r.Int64N(50), Per: randDur(r, time.Microsecond, hi*10/3)}
		default:
			p.Kind = tiers.KindFixedWindow
			u := tiers.Unit(1 + r.IntN(2))
			if r.IntN(3) == 0 {
				u = tiers.Unit(1 + r.IntN(int(tiers.UnitYear))) // hours to years
			}
			p.Window = tiers.FixedWindow{Limit: 1 + r.Int64N(100), Unit: u}
		}
		p, _ = tiers.Normalize(p)
		p.Overdraft = r.IntN(3) == 0 && !p.Concurrency // post-paid counting
		if tiers.Validate(&p) == nil {
			return &p
		}
	}
}

// trace replays one random trace against the stores and demands the
// decisions of the first (the reference) from the others.
func trace(t *testing.T, seed uint64, steps int, stores []store.Store, names []string) {
	t.Helper()
	traceWith(t, seed, steps, stores, names, randPolicy)
}

// traceWith is trace with the trace's policies drawn by gen.
func traceWith(t *testing.T, seed uint64, steps int, stores []store.Store, names []string, gen func(*rand.Rand) *tiers.Policy) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 99))
	type res struct {
		name string
		p    *tiers.Policy
	}
	var resources []res
	for i := range 1 + r.IntN(4) {
		resources = append(resources, res{fmt.Sprint("r", i), gen(r)})
	}
	// span is the longest finite window or period of the trace's policies
	// (at least 20 s): jumps of up to span reach the end of a long window,
	// active period or cooldown.
	span := 20 * time.Second
	for _, rs := range resources {
		p := rs.p
		for _, d := range []time.Duration{p.Bucket.Per, p.Window.Unit.Length()} {
			span = max(span, d)
		}
		for _, t := range p.Tiers {
			for _, d := range []time.Duration{t.Window, t.Active, t.Cooldown} {
				if d != tiers.Unbounded {
					span = max(span, d)
				}
			}
		}
	}
	now := storetest.T0.Add(randDur(r, 0, time.Hour))
	ctx := context.Background()
	// The instants of concurrency limits' grants, per key, for refunds
	// that name their takes.
	taken := map[store.Key][]time.Time{}
	for step := range steps {
		switch r.IntN(10) {
		case 0: // same instant
		case 1:
			now = now.Add(randDur(r, time.Second, 20*time.Second))
		case 3:
			now = now.Add(randDur(r, time.Second, span))
		case 2:
			now = now.Add(-randDur(r, time.Microsecond, 5*time.Millisecond)) // a clock going back a little
		default:
			now = now.Add(randDur(r, time.Microsecond, 400*time.Millisecond))
		}
		items := make([]store.Item, 1+r.IntN(4))
		for i := range items {
			rs := resources[r.IntN(len(resources))]
			hits := int64(1 + r.IntN(4))
			if r.IntN(5) == 0 {
				hits = 1 + r.Int64N(120)
			}
			key := store.Key{Resource: rs.name, Domain: fmt.Sprint("d", r.IntN(3)), PolicyID: seed}
			if r.IntN(12) == 0 {
				items[i] = store.Item{Key: key, Policy: rs.p} // a check of 0 hits
				continue
			}
			items[i] = storetest.RandomItem(r, key, rs.p, hits)
			if it := &items[i]; it.Refund && rs.p.Concurrency && r.IntN(3) > 0 {
				it.SlotsAt = now.Add(-randDur(r, 0, span))
				if ts := taken[key]; len(ts) > 0 && r.IntN(4) > 0 {
					it.SlotsAt = ts[r.IntN(len(ts))]
				}
			}
		}
		var want []tiers.Decision
		for k, s := range stores {
			got := make([]tiers.Decision, len(items))
			if err := s.Decide(ctx, now, items, got); err != nil {
				t.Fatalf("seed %d step %d: %s: %v", seed, step, names[k], err)
			}
			if k == 0 {
				want = got
				for i, d := range got {
					if !d.SlotsAt.IsZero() {
						taken[items[i].Key] = append(taken[items[i].Key], d.SlotsAt)
					}
				}
				continue
			}
			if diff := cmp.Diff(want, got); diff != "" {
				for _, rs := range resources {
					t.Logf("%s: %+v", rs.name, *rs.p)
				}
				t.Fatalf("seed %d step %d at %v, items %+v (-%s +%s):\n%s", seed, step, now, items, names[0], names[k], diff)
			}
		}
	}
}

// TestApplyPart is the differential test of the apply part (apply.lua,
// store.Apply over a call's items): it replays random traces (random
// policies of every kind, admission or post-paid, checks of 0 hits,
// windows and periods from milliseconds to days, copies, minimums,
// refunds, shadow and multi-item calls, µs times, jumps of up to the
// longest period, a clock going back a little) against the reference store
// (tiers and store.Apply), the memory store, the Redis store, and a Redis
// store whose library has every fast path cut off (generalOnly), at the
// same now. The tiers part has its own (TestTiersPart), and so has each
// fast path (paths_test.go).
func TestApplyPart(t *testing.T) {
	_, c := singleClient(t)
	general := generalOnly(t)
	traces, steps := 1500, 30
	if testing.Short() {
		traces = 200
	}
	for seed := range uint64(traces) {
		var m storetest.Model
		mem := memstore.New(memstore.Options{})
		rs := testStore(t, c, Options{Clock: ClockCaller})
		gs := testStore(t, general, Options{Clock: ClockCaller})
		trace(t, seed, steps, []store.Store{&m, mem, rs, gs}, []string{"model", "memstore", "redis", "redis-general"})
	}
}

// TestApplyPartCluster does the same against a 3-master Cluster, where
// calls spanning slots take the two-step.
func TestApplyPartCluster(t *testing.T) {
	_, c := clusterClient(t)
	traces := 300
	if testing.Short() {
		traces = 50
	}
	for seed := range uint64(traces) {
		var m storetest.Model
		rs := testStore(t, c, Options{Clock: ClockCaller})
		trace(t, seed, 30, []store.Store{&m, rs}, []string{"model", "redis-cluster"})
	}
}

// undoablePolicy returns a random policy of randPolicy's that a call
// spanning Cluster slots decides in one round trip (undoable): fixed
// windows, one tier active for ever, post-paid policies of any kind, all
// without a global limit.
func undoablePolicy(r *rand.Rand) *tiers.Policy {
	for {
		p := randPolicy(r)
		if r.IntN(3) == 0 && p.Kind == tiers.KindTiers && len(p.Tiers) > 0 {
			// One tier active for ever, as a Lyft rate_limit (randPolicy
			// seldom draws one).
			p.Tiers = p.Tiers[:1]
			p.Tiers[0].Active = tiers.Unbounded
			p.HardLimit, p.GlobalLimit = 0, 0
			q, err := tiers.Normalize(*p)
			if err != nil || tiers.Validate(&q) != nil {
				continue
			}
			p = &q
		}
		if undoable([]store.Item{{Policy: p, Hits: 1, Min: 1}}) {
			return p
		}
	}
}

// TestDifferentialClusterOneTrip replays random traces of the policies
// whose calls spanning slots take one round trip per slot (undoable)
// against the reference store: every call that a slot rejects after others
// granted is given back by an undo before Decide returns, so the next call
// must find exactly the reference's state. It fails unless undos were made.
func TestDifferentialClusterOneTrip(t *testing.T) {
	_, c := clusterClient(t)
	traces := 300
	if testing.Short() {
		traces = 60
	}
	var given, failed uint64
	for seed := range uint64(traces) {
		var m storetest.Model
		rs := testStore(t, c, Options{Clock: ClockCaller})
		traceWith(t, seed, 40, []store.Store{&m, rs}, []string{"model", "redis-cluster"}, undoablePolicy)
		g, f := rs.Undone()
		given, failed = given+g, failed+f
	}
	if given == 0 || failed != 0 {
		t.Fatalf("%d slots given back, %d failed: want some given back, none failed", given, failed)
	}
	t.Logf("%d slots given back", given)
}
