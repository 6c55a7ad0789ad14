package store_test

import (
	"testing"
	"time"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/tiers"
)

// benchApply runs store.Apply over items on states of their own (states
// and globals resolved as memstore does: one per Key, one per resource's
// global), its plan made for each call, one call every step, after a
// warm-up.
func benchApply(b *testing.B, items []store.Item, step time.Duration) {
	states := make([]*tiers.State, len(items))
	globals := make([]*tiers.Global, len(items))
	byKey := map[store.Key]*tiers.State{}
	byRes := map[string]*tiers.Global{}
	for i, it := range items {
		if byKey[it.Key] == nil {
			byKey[it.Key] = new(tiers.State)
		}
		states[i] = byKey[it.Key]
		if it.Policy.GlobalLimit > 0 {
			if byRes[it.Key.Resource] == nil {
				byRes[it.Key.Resource] = new(tiers.Global)
			}
			globals[i] = byRes[it.Key.Resource]
		}
	}
	out := make([]tiers.Decision, len(items))
	var plan store.Plan
	now := time.Unix(1_700_000_000, 0)
	apply := func() bool {
		plan.Make(items)
		ok, err := store.Apply(now, &plan, items, states, globals, out)
		if err != nil {
			b.Fatal(err)
		}
		now = now.Add(step)
		return ok
	}
	for range 1000 {
		apply()
	}
	b.ReportAllocs()
	b.ResetTimer()
	granted := 0
	for range b.N {
		if apply() {
			granted++
		}
	}
	if granted == 0 && b.N > 1000 {
		b.Fatal("nothing granted")
	}
}

// BenchmarkApply is store.Apply alone: three one-tier descriptors on
// distinct keys (an RLS request of three plain rate_limits), and a call
// whose items share a key and a global limit (groups, the cut).
func BenchmarkApply(b *testing.B) {
	one := &tiers.Policy{Tiers: []tiers.Tier{{Limit: 100, Window: time.Second, Active: tiers.Unbounded}}}
	glob := &tiers.Policy{GlobalLimit: 1000, Tiers: []tiers.Tier{{Limit: 100, Window: time.Second, Active: tiers.Unbounded}}}
	take := func(p *tiers.Policy, res, dom string) store.Item {
		return store.Item{Key: store.Key{Resource: res, Domain: dom, PolicyID: 1}, Policy: p, Hits: 1, Min: 1}
	}
	b.Run("three", func(b *testing.B) {
		benchApply(b, []store.Item{take(one, "user=u1", "d"), take(one, "tenant=t1", "d"), take(one, "api=a/user=u1", "d")}, time.Millisecond)
	})
	b.Run("grouped", func(b *testing.B) {
		benchApply(b, []store.Item{take(glob, "api", "u1"), take(glob, "api", "u2"), take(glob, "api", "u1"), take(one, "user=u1", "d")}, time.Millisecond)
	})
}

// BenchmarkPlan is Plan.Make alone, for the calls of BenchmarkApply: what
// grouping a call costs once per Decide.
func BenchmarkPlan(b *testing.B) {
	one := &tiers.Policy{Tiers: []tiers.Tier{{Limit: 100, Window: time.Second, Active: tiers.Unbounded}}}
	glob := &tiers.Policy{GlobalLimit: 1000, Tiers: []tiers.Tier{{Limit: 100, Window: time.Second, Active: tiers.Unbounded}}}
	take := func(p *tiers.Policy, res, dom string) store.Item {
		return store.Item{Key: store.Key{Resource: res, Domain: dom, PolicyID: 1}, Policy: p, Hits: 1, Min: 1}
	}
	for _, c := range []struct {
		name  string
		items []store.Item
	}{
		{"three", []store.Item{take(one, "user=u1", "d"), take(one, "tenant=t1", "d"), take(one, "api=a/user=u1", "d")}},
		{"grouped", []store.Item{take(glob, "api", "u1"), take(glob, "api", "u2"), take(glob, "api", "u1"), take(one, "user=u1", "d")}},
	} {
		b.Run(c.name, func(b *testing.B) {
			var p store.Plan
			b.ReportAllocs()
			for b.Loop() {
				p.Make(c.items)
			}
		})
	}
}
