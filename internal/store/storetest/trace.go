package storetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/tiers"
)

// Trace is a random trace of calls, starting at T0, each up to Gap (in whole
// milliseconds) after the one before. A call has 1 to Items items of 1 to 4
// hits and a random minimum, one in ten a refund and one in ten shadow; the
// resource "rand<i>" carries Policies[i] under policy ID i, in one of Domains
// domains. With Variants[i] (when Variants has an i-th entry that is not
// empty), each call takes one of its policies, at random, for every item of
// "rand<i>" instead of Policies[i], still under policy ID i: the same rule
// under other numbers (policies of one shape, tiers.Policy.Shape), as
// reloads and requests' own limits change them.
type Trace struct {
	Seed     uint64 // picks the trace
	Steps    int
	Gap      time.Duration
	Items    int
	Domains  int
	Policies []*tiers.Policy
	Variants [][]*tiers.Policy
}

// Replay makes the calls of tr on s and on ref at the same instants and
// hands each call's items and decisions to check. It fails t when a call
// fails.
func (tr Trace) Replay(t testing.TB, s, ref store.Store, check func(step int, now time.Time, items []store.Item, got, want []tiers.Decision)) {
	t.Helper()
	r := rand.New(rand.NewPCG(tr.Seed, tr.Seed+1))
	now := T0
	for step := range tr.Steps {
		now = now.Add(time.Duration(r.IntN(int(tr.Gap/time.Millisecond))) * time.Millisecond)
		items := make([]store.Item, 1+r.IntN(tr.Items))
		var chosen map[int]*tiers.Policy
		for i := range items {
			pi := r.IntN(len(tr.Policies))
			hits := int64(1 + r.IntN(4))
			key := store.Key{Resource: fmt.Sprint("rand", pi), Domain: fmt.Sprint("d", r.IntN(tr.Domains)), PolicyID: uint64(pi)}
			p := tr.Policies[pi]
			if pi < len(tr.Variants) && len(tr.Variants[pi]) > 0 {
				// One variant per rule and call: the items of one key
				// carry one policy.
				if chosen == nil {
					chosen = make(map[int]*tiers.Policy)
				}
				if chosen[pi] == nil {
					chosen[pi] = tr.Variants[pi][r.IntN(len(tr.Variants[pi]))]
				}
				p = chosen[pi]
			}
			items[i] = RandomItem(r, key, p, hits)
		}
		got := make([]tiers.Decision, len(items))
		want := make([]tiers.Decision, len(items))
		if err := ref.Decide(context.Background(), now, items, want); err != nil {
			t.Fatalf("step %d: reference: %v", step, err)
		}
		if err := s.Decide(context.Background(), now, items, got); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		check(step, now, items, got, want)
	}
}

// RandomItem returns an item of k under p for hits, drawing from r a minimum
// from 1 to hits, and whether it is a refund (one in ten) or shadow (one in
// ten).
func RandomItem(r *rand.Rand, k store.Key, p *tiers.Policy, hits int64) store.Item {
	it := store.Item{Key: k, Policy: p, Hits: hits, Min: 1 + r.Int64N(hits)}
	switch r.IntN(10) {
	case 0:
		it.Refund = true
	case 1:
		it.Shadow = true
	}
	return it
}
