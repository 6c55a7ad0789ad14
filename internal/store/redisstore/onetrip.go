package redisstore

import (
	"context"
	"slices"

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
	c.slots = c.slots[:0]
	for _, sl := range c.slot {
		if !slices.Contains(c.slots, sl) {
			c.slots = append(c.slots, sl)
		}
	}
	slices.Sort(c.slots)
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
			s.undoLater(c, sc, items, out)
			return err
		}
	}
	if !rejected(c, out, -1) {
		return nil
	}
	bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), lateReplyWait)
	defer cancel()
	sc.run(func(k int, sub *call) {
		sl := int(c.slots[k])
		if rejected(c, out, sl) {
			return // its own Apply committed nothing but what stays
		}
		args := undoArgs(s, c, items, sl, sub.used, out)
		if args == nil {
			return
		}
		for a := 0; ; a++ {
			sub.args = args
			_, sub.err = s.fcall(bg, sub)
			if !isTryAgain(sub.err) || wait(bg, a) != nil {
				break
			}
		}
		if sub.err != nil {
			s.undone.failed.Add(1)
		} else {
			s.undone.given.Add(1)
		}
		sub.args = nil
	})
	return nil
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

// undoArgs returns the FCALL (mode undo) that gives back what the groups
// of slot sel committed when the slot decided at used (µs): per group that
// is not post-paid and was granted, its members' grants summed (and
// whether it entered its tier), at the group's state key. It is nil when
// there is nothing to give back. It allocates: a rejected call's path.
func undoArgs(s *Store, c *call, items []store.Item, sel int, used int64, out []tiers.Decision) []any {
	var keys []string
	var pols []*encoded
	var h []byte
	n := 0
	for i := range items {
		if !c.plan.Leads(i) || int(c.slot[i]) != sel || c.plan.PostPaid(i) || !out[i].OK {
			continue
		}
		var granted int64
		for j := i; j >= 0; j = c.plan.Next(j) {
			granted += out[j].Granted
		}
		if granted == 0 && !out[i].Burst {
			continue
		}
		keys = append(keys, c.skey[i])
		p := slices.Index(pols, c.enc[i])
		if p < 0 {
			p = len(pols)
			pols = append(pols, c.enc[i])
		}
		h = appendUndoItem(h, len(keys), p+1, granted, out[i].Burst)
		n++
	}
	if n == 0 {
		return nil
	}
	hdr := append(appendUndoHead(nil, used, s.maxTTL, s.caller, len(keys), n), h...)
	args := []any{fcallName, funcNameArg, len(keys)}
	for _, k := range keys {
		args = append(args, k)
	}
	args = append(args, hdr, "")
	for _, e := range pols {
		args = append(args, e.arg)
	}
	return args
}

// appendUndoHead appends the head of ARGV[1] of a call in mode undo
// (apply.lua's undo; the layout of every mode, pipeline.go's hdrFields),
// for n items on nk state keys whose grants were made at now (µs). newest
// (the lockTTL field: 1) tells the undo that now was a caller's and that
// no call on those keys came between the grants and the undo, so a tier's
// hits are in its log's newest bucket (the grant may have joined a newer
// bucket than now's when that clock went back); without it they are in
// the bucket that starts where now's bucket starts, as on Redis's clock.
func appendUndoHead(h []byte, now, maxTTL int64, newest bool, nk, n int) []byte {
	var f int64
	if newest {
		f = 1
	}
	for _, v := range []int64{modeUndo, now, maxTTL, f, int64(nk), int64(n)} {
		h = appendF64(h, v)
	}
	return h
}

// appendUndoItem appends one item of a call in mode undo (itemFields
// doubles): give back granted hits at the state key KEYS[key] of policy
// ARGV[2+pol]; entered: the grant entered its tier (Burst). No global key
// (undoableTake), no minimum.
func appendUndoItem(h []byte, key, pol int, granted int64, entered bool) []byte {
	var f int64
	if entered {
		f = flagEntered
	}
	for _, v := range []int64{int64(key), 0, int64(pol), granted, 0, f} {
		h = appendF64(h, v)
	}
	return h
}

// undoLater gives back, in the background (Settle waits for it) and within
// lateReplyWait, what the slots of a failed oneTrip call that answered
// committed (every slot whose own Apply rejected nothing: the call answers
// an error, its caller decides by its failure mode). It copies what it
// sends: sc goes back to the pool.
func (s *Store) undoLater(c *call, sc *slotCalls, items []store.Item, out []tiers.Decision) {
	var cmds [][]any
	for k, sub := range sc.subs {
		if sub.err != nil || sub.st != statusDone {
			continue
		}
		sl := int(c.slots[k])
		if rejected(c, out, sl) {
			continue
		}
		if args := undoArgs(s, c, items, sl, sub.used, out); args != nil {
			cmds = append(cmds, args)
		}
	}
	if len(cmds) == 0 {
		return
	}
	s.background(func() {
		ctx, cancel := context.WithTimeout(context.Background(), lateReplyWait)
		defer cancel()
		given, failed := s.giveBack(ctx, cmds)
		s.undone.given.Add(uint64(given))
		s.undone.failed.Add(uint64(failed))
	})
}

// Undone reports how many slots of Cluster calls spanning slots gave back
// their grants because another slot rejected (or failed), and how many of
// those undos failed (their hits stay counted until they leave their
// window).
func (s *Store) Undone() (given, failed uint64) {
	return s.undone.given.Load(), s.undone.failed.Load()
}
