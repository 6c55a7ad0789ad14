package redisstore

import (
	"context"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/tiers"
)

// undoable reports whether a call spanning Cluster slots can take oneTrip:
// whether every grant a slot commits can be given back exactly when
// another slot rejects. Refund items always apply, and post-paid items are
// committed whatever the others answer (store.Apply, step 3), so neither
// is given back; every take item must be undoableTake.
func undoable(items []store.Item) bool {
	for i := range items {
		it := &items[i]
		if it.Refund || (it.Policy.Overdraft && it.Policy.GlobalLimit == 0) {
			continue
		}
		if !undoableTake(it.Policy) {
			return false
		}
	}
	return true
}

// undoableTake reports whether what a take of policy p granted can be
// given back exactly (the undo mode of apply.lua): a take of a fixed window
// is a count (given back in the same window), and a take of one tier
// active for ever with no hard or global limit (a plain rate_limit) adds
// hits to two logs (given back from the buckets they were added to).
// Nothing else can be given back exactly: a token bucket's debit is
// absorbed by its capacity once it refills to it, so what a refund must
// give back depends on the calls made since; a walk through burst tiers may
// enter tiers whose phases a later call sees; a global limit's room is
// shared with the resource's other groups, which a post-paid group of the
// call would see committed or not; a post-paid debit may go into debt
// (its buckets are not add's).
func undoableTake(p *tiers.Policy) bool {
	if p.GlobalLimit > 0 || p.Overdraft {
		return false
	}
	switch p.Kind {
	case tiers.KindFixedWindow:
		return true
	case tiers.KindTiers:
		return len(p.Tiers) <= 1 && p.HardLimit == 0 && (len(p.Tiers) == 0 || p.Tiers[0].Active == tiers.Unbounded)
	}
	return false
}

// oneTrip decides a call whose keys span Cluster slots, all or nothing, in
// one round trip per slot when every slot grants:
//
//  1. Every slot decides and applies its items at once (one script call
//     per slot, all sent together through the dispatchers), as a call of
//     one slot does: store.Apply over the slot's items, answering busy
//     with nothing written when a two-step call of another process holds
//     one of its keys (such a slot is sent again after a short wait, the
//     others keep what they did).
//  2. If no slot rejected a non-shadow group, the call is granted: done.
//     Otherwise store.Apply over all the items answers what every slot
//     answered (the groups of different slots share nothing), but commits
//     nothing besides the refunds and the post-paid groups, which every
//     slot applied anyway: the slots that had no rejection of their own
//     committed their other groups' grants, which a second script call per
//     such slot gives back exactly (undo in apply.lua: the same count
//     or buckets, at the instant they were added).
//
// Between the two round trips the keys of the slots that granted look
// fuller than they are (a call deciding on them then may be refused where
// the call's rejection would have left room): a request is never granted
// more than the limits allow, and once the undo lands the rejected call
// has consumed nothing. When an undo fails (its master died, a timeout),
// the call's answer stands (it is refused, which it is); the hits it was
// to give back stay counted until they leave their window (Undone counts
// the failure).
//
// On an error of a slot's first step the call fails with that error; the
// slots that answered and committed are given back in the background (the
// failed slot's script may have run: its grants are given back by the
// dispatcher when its late reply comes, as any call's whose caller gave
// up).
func (s *Store) oneTrip(ctx context.Context, c *call, items []store.Item, now int64, out []tiers.Decision) error {
	sc := s.slotCalls(c)
	defer sc.done(s)
	for _, sub := range sc.subs {
		sub.st = statusBusy // to be sent
	}
	for attempt := 0; ; attempt++ {
		sc.run(func(k int, sub *call) {
			if sub.st == statusBusy {
				sub.st, sub.used, sub.err = s.exec(ctx, sub, items, int(c.slots[k]), modeChecked, now, "", out)
				if isTryAgain(sub.err) {
					// It did not run: send it again, as a busy slot.
					sub.st, sub.err = statusBusy, nil
				}
			}
		})
		var err error
		busy := false
		for _, sub := range sc.subs {
			if sub.err != nil && err == nil {
				err = sub.err
			}
			busy = busy || (sub.err == nil && sub.st == statusBusy)
		}
		if err == nil && !busy {
			break
		}
		if err == nil {
			err = wait(ctx, attempt)
		}
		if err != nil {
			// The call fails: the slots that answered give back every
			// grant, in the background (it copies what it sends: sc goes
			// back to the pool).
			if cmds := slotsBack(sc, backLate, s.caller); len(cmds) > 0 {
				s.background(func() {
					ctx, cancel := context.WithTimeout(context.Background(), lateReplyWait)
					defer cancel()
					s.sendBack(ctx, cmds, &s.undone)
				})
			}
			return err
		}
	}
	if !rejected(c, out, -1) {
		return nil
	}
	// A slot rejected: the others give back what they committed (a slot
	// whose own Apply rejected committed nothing but what stays).
	if cmds := slotsBack(sc, backRejected, s.caller); len(cmds) > 0 {
		bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), lateReplyWait)
		defer cancel()
		s.sendBack(bg, cmds, &s.undone)
	}
	return nil
}

// slotsBack returns the give-backs (backFor) of the slots of sc that
// answered their last call.
func slotsBack(sc *slotCalls, why backWhy, newest bool) [][]any {
	var cmds [][]any
	for _, sub := range sc.subs {
		if sub.err != nil {
			continue
		}
		if cmd := backFor(sub.args, sub.pols, sub.res, why, newest); cmd != nil {
			cmds = append(cmds, cmd)
		}
	}
	return cmds
}

// rejected reports whether a non-shadow group of the items of slot sel
// (-1: of every slot) was rejected, store.Apply's test for committing
// nothing but refunds and post-paid groups. A group (c.plan) is the take
// items of one key, led by the first; its members share its answer.
func rejected(c *call, out []tiers.Decision, sel int) bool {
	for i := range c.plan.Len() {
		if c.plan.Leads(i) && !c.plan.Shadow(i) && !out[i].OK && (sel < 0 || int(c.slot[i]) == sel) {
			return true
		}
	}
	return false
}

// Undone reports how many slots of Cluster calls spanning slots gave back
// their grants because another slot rejected (or failed), and how many of
// those undos failed (their hits stay counted until they leave their
// window).
func (s *Store) Undone() (given, failed uint64) {
	return s.undone.given.Load(), s.undone.failed.Load()
}
