package store

import (
	"fmt"
	"time"

	"github.com/charonlimit/charon/tiers"
)

// Apply is the Decide procedure, written once. The caller resolves, for
// every item, states[i], the state of items[i].Key (items with the same Key
// share one pointer, items of different Keys do not), and globals[i], the
// global state of Resource or nil when items[i].Policy.GlobalLimit
// is 0 (items of one resource share one pointer), makes plan, the items'
// Plan (plan.Make(items)), and holds whatever makes the states exclusive for
// the call. Apply writes one decision per item to out and reports whether
// the takes were committed.
//
// The procedure, which every store must reproduce exactly:
//
//  1. Every refund item, in order: tiers.RefundSlots(SlotsAt, Hits) (for
//     all but a concurrency limit's refund naming its take, tiers.Refund),
//     then out[i] is the tiers.Peek of one hit, with Granted 0 and OK
//     true.
//  2. The other items are grouped as plan says: a group is the items
//     sharing a Key, led by the first of them, and asks for the sum of its
//     members' Hits and Min. In leader order, each group's answer d is
//     tiers.Peek of that sum. When d is granted and the policy has a global
//     limit G, d's grant is cut to G − g0 − S, where g0 = d.ResourceHits −
//     d.Granted is the resource's count before the request and S the
//     predicted grants of the earlier granted groups sharing that global
//     state; if that leaves fewer than the group's Min, d becomes a
//     rejection (OK false, Granted 0, LimitedByGlobal true, Remaining the
//     room left, at least 0; RetryAfter and ResetAfter tiers.Unbounded when
//     Min + S exceeds G, so that the request can never fit, else one
//     second, the global count's window, after which the hits counted now
//     have left it; the other fields as Peek gave them). Because tiers
//     grants hit by hit and groups of different states meet only in the
//     global count, this predicts exactly what committing the groups one
//     after another would answer.
//  3. If a non-shadow group is rejected, nothing is committed but the
//     post-paid groups (Policy.Overdraft: their hits are debited whatever
//     the answer), each committed in leader order with tiers.Request of its
//     sums; every member of a group gets the group's answer (the predicted
//     one, or the Request's for a post-paid group), and Apply returns false.
//  4. Otherwise each group, in leader order, except the rejected shadow
//     groups that are not post-paid, is committed with tiers.Request of its
//     sums, and its members get the answer. Apply returns true.
//
// In steps 3 and 4 a group's grant n is split between its members in item
// order: each gets its Min, then the rest of n up to its Hits, first come
// first served. Rejected members get Granted 0.
//
// Apply does not allocate. It returns an error wrapping ErrBadItem, before
// changing anything, when an item cannot be decided or plan is not of as
// many items.
func Apply(now time.Time, plan *Plan, items []Item, states []*tiers.State, globals []*tiers.Global, out []tiers.Decision) (committed bool, err error) {
	return apply(now, now, false, plan, items, states, globals, out)
}

// ApplyReserve is Apply for a paced request held until the later instant
// at: every tiers.Peek and tiers.Request above is tiers.PeekReserve and
// tiers.Reserve at (now, at) (at not after now: Peek and Request at now),
// and every refund tiers.RefundReserved at (now, at), giving back a
// reservation made for at.
func ApplyReserve(now, at time.Time, plan *Plan, items []Item, states []*tiers.State, globals []*tiers.Global, out []tiers.Decision) (committed bool, err error) {
	return apply(now, at, true, plan, items, states, globals, out)
}

// peek, request and refund are tiers' Peek, Request and RefundSlots at
// now, or with res their reservations for at.
func peek(p *tiers.Policy, s *tiers.State, g *tiers.Global, now, at time.Time, res bool, k, m int64) tiers.Decision {
	if res {
		return tiers.PeekReserve(p, s, g, now, at, k, m)
	}
	return tiers.Peek(p, s, g, now, k, m)
}

func request(p *tiers.Policy, s *tiers.State, g *tiers.Global, now, at time.Time, res bool, k, m int64) tiers.Decision {
	if res {
		return tiers.Reserve(p, s, g, now, at, k, m)
	}
	return tiers.Request(p, s, g, now, k, m)
}

func refund(p *tiers.Policy, s *tiers.State, g *tiers.Global, now, at time.Time, res bool, it *Item) {
	if res {
		tiers.RefundReserved(p, s, g, now, at, it.Hits)
		return
	}
	tiers.RefundSlots(p, s, g, now, it.SlotsAt, it.Hits)
}

func apply(now, at time.Time, res bool, plan *Plan, items []Item, states []*tiers.State, globals []*tiers.Global, out []tiers.Decision) (committed bool, err error) {
	if err := Check(items, out); err != nil {
		return false, err
	}
	if len(states) < len(items) || len(globals) < len(items) || plan.Len() != len(items) {
		return false, fmt.Errorf("%w: %d items, %d states, %d globals, a plan of %d", ErrBadItem, len(items), len(states), len(globals), plan.Len())
	}
	for i := range items {
		it := &items[i]
		if !it.Refund {
			continue
		}
		refund(it.Policy, states[i], globals[i], now, at, res, it)
		d := peek(it.Policy, states[i], globals[i], now, at, res, 1, 1)
		d.Granted, d.OK, d.SlotsAt = 0, true, time.Time{}
		out[i] = d
	}

	switch plan.Groups() {
	case 0:
		return true, nil
	case 1:
		// One group: tiers.Request answers exactly what Peek would and
		// commits nothing when it rejects, so the prediction pass is not
		// needed.
		i := plan.First()
		hits, min := plan.Sums(i)
		out[i] = request(items[i].Policy, states[i], globals[i], now, at, res, hits, min)
		split(plan, items, i, out)
		return out[i].OK || plan.Shadow(i) || plan.PostPaid(i), nil
	}

	rejected := false
	for i := range items {
		if !plan.Leads(i) {
			continue
		}
		hits, min := plan.Sums(i)
		d := peek(items[i].Policy, states[i], globals[i], now, at, res, hits, min)
		if g := plan.Global(i); d.OK && g >= 0 && d.GlobalLimit > 0 {
			var s int64
			for k := g; k < i; k++ {
				if plan.Leads(k) && plan.Global(k) == g && out[k].OK {
					s += out[k].Granted
				}
			}
			room := d.GlobalLimit - (d.ResourceHits - d.Granted) - s
			if room < d.Granted {
				if room >= min {
					d.Granted = room
				} else {
					d.OK, d.Granted, d.LimitedByGlobal = false, 0, true
					d.Remaining = max(room, 0)
					d.RetryAfter = time.Second
					if min+s > d.GlobalLimit {
						d.RetryAfter = tiers.Unbounded
					}
					d.ResetAfter = d.RetryAfter
				}
			}
		}
		out[i] = d
		if !d.OK && !plan.Shadow(i) {
			rejected = true
		}
	}
	if rejected {
		for i := range items {
			if plan.Leads(i) {
				if plan.PostPaid(i) {
					hits, min := plan.Sums(i)
					out[i] = request(items[i].Policy, states[i], globals[i], now, at, res, hits, min)
				}
				split(plan, items, i, out)
			}
		}
		return false, nil
	}
	for i := range items {
		if !plan.Leads(i) {
			continue
		}
		if plan.Shadow(i) && !out[i].OK && !plan.PostPaid(i) {
			split(plan, items, i, out)
			continue
		}
		hits, min := plan.Sums(i)
		out[i] = request(items[i].Policy, states[i], globals[i], now, at, res, hits, min)
		split(plan, items, i, out)
	}
	return true, nil
}

// Check reports, wrapping ErrBadItem, the first item that cannot be decided,
// or an out too short for the items' decisions: what every Decide checks
// before touching state.
func Check(items []Item, out []tiers.Decision) error {
	if len(out) < len(items) {
		return fmt.Errorf("%w: %d items, %d decisions", ErrBadItem, len(items), len(out))
	}
	for i := range items {
		it := &items[i]
		switch {
		case it.Policy == nil:
			return fmt.Errorf("%w: items[%d]: no policy", ErrBadItem, i)
		case it.Hits < 0:
			return fmt.Errorf("%w: items[%d]: hits %d, want >= 0", ErrBadItem, i, it.Hits)
		case !it.Refund && it.Hits == 0 && it.Min != 0:
			return fmt.Errorf("%w: items[%d]: min %d of a check (0 hits), want 0", ErrBadItem, i, it.Min)
		case !it.Refund && it.Hits > 0 && (it.Min < 1 || it.Min > it.Hits):
			return fmt.Errorf("%w: items[%d]: min %d, want in [1, %d]", ErrBadItem, i, it.Min, it.Hits)
		}
	}
	return nil
}

// CheckDecide is what a store's Decide checks before anything else:
// ErrClosed once the store is closed, else Check's answer.
func CheckDecide(closed bool, items []Item, out []tiers.Decision) error {
	if closed {
		return ErrClosed
	}
	return Check(items, out)
}

// split copies the answer out[i] of the group i leads to its members,
// sharing its grant.
func split(plan *Plan, items []Item, i int, out []tiers.Decision) {
	d := out[i]
	if !d.OK {
		for j := i; j >= 0; j = plan.Next(j) {
			out[j] = d
			out[j].Granted = 0
		}
		return
	}
	_, groupMin := plan.Sums(i)
	extra := d.Granted - groupMin
	for j := i; j >= 0; j = plan.Next(j) {
		e := min(items[j].Hits-items[j].Min, extra)
		extra -= e
		out[j] = d
		out[j].Granted = items[j].Min + e
		if out[j].Granted == 0 {
			out[j].SlotsAt = time.Time{} // a check took no slot
		}
	}
}

// Reserved returns what a reservation's items took, to give back when its
// request is not served (Reserver.GiveBack's items): per item granted (OK,
// Granted above 0), a copy with Hits its grant and Min 0. It is nil when a
// non-shadow item was rejected: the reservation committed nothing (Apply,
// step 3), there is nothing to give back.
func Reserved(items []Item, out []tiers.Decision) []Item {
	var back []Item
	for i := range items {
		if !out[i].OK && !items[i].Shadow && !items[i].Refund {
			return nil
		}
	}
	for i := range items {
		if out[i].OK && out[i].Granted > 0 {
			it := items[i]
			it.Hits, it.Min = out[i].Granted, 0
			back = append(back, it)
		}
	}
	return back
}

// GiveBackItems returns a copy of a reservation's items with Refund set,
// and room for their decisions: what a Reserver's GiveBack applies.
func GiveBackItems(items []Item) ([]Item, []tiers.Decision) {
	back := make([]Item, len(items))
	copy(back, items)
	for i := range back {
		back[i].Refund, back[i].Shadow = true, false
	}
	return back, make([]tiers.Decision, len(items))
}
