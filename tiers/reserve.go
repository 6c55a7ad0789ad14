package tiers

import (
	"errors"
	"fmt"
	"time"
)

// Pacing: a request the policy rejects now but would grant a little later
// may be held until then and granted instead of rejected. The hits of such a
// request are reserved now, at the later instant at: later requests see them
// and queue behind them, and the request is answered at at. A reservation is
// decided at now so that the limit holds on the instants requests are
// answered at, not only on the instants their hits are stamped with:
//
//   - KindTiers (a policy of one tier, with or without hard and global
//     limits): the walk is made at at, over every hit the logs hold (a log
//     counts a hit stamped after t at every t before it), and its hits are
//     stamped at; the logs are pruned at now, never at at, so that what the
//     present counts stays counted. Every hit is then stamped at or after
//     the instant it is answered at, and the last hit committed into any
//     window of answers saw all the others: no window of W holds more than
//     L answers. The tier must be active at now (or, active for ever, never
//     entered) and still at at: a reservation never enters or leaves a tier.
//   - KindTokenBucket: granted when the balance at at covers the hits; the
//     balance is then set at now to what it is to be at at after the grant,
//     less the refill until at: it may fall below 0, a debt the wait repays
//     (as a reservation of golang.org/x/time/rate does), bounded by the
//     capacity (a longer debt is refused). A request before at sees only
//     what remains once the reservation is served.
//
//     A give-back cannot simply add the credits back. The balance is one
//     number, every grant taken from it as min(balance, capacity less the
//     refill until its instant) less its hits, the min being what a full
//     bucket loses. A reservation R2 made while R1 was pending may have
//     seen the bucket full at its instant; without R1 the bucket would
//     have been full sooner, losing R1's credits. Capacity 2, refill 1/s:
//     at 0 take 1; R1, 1 credit at 1s (the bucket full then); R2, 2
//     credits at 2s (full again). R1 given back at 0.25s with its credit
//     added: at 2s the balance shows 1 credit beside R2's 2, 3 credits
//     answered at one instant. Had R1 never been made the balance would
//     be the same as with it: nothing can come back.
//
//     Exactly: a give-back of R restores its hits unless a reservation
//     made after R, for a later instant than R's, would lose them; such a
//     reservation leaves room for at most its headroom (capacity less the
//     balance it saw at its instant) before the min clips it. So the state
//     keeps ahead, the latest instant reserved, and room, the least
//     headroom of the reservations made since nothing was pending (every
//     give-back to come is of one of them), less what give-backs restored
//     since: a reservation for ahead or later gets all its hits back, an
//     earlier one at most room. Never more than the balance a run without
//     R would have (FuzzPace checks it against a model of the answers);
//     less only when the one number cannot say which instant is free (in
//     the example a request at 1s could take R1's credit and R2 still
//     fit, but a balance granting it would grant beside R2 at 2s too).
//   - KindFixedWindow, KindQuota: within the window (period) holding now,
//     a reservation is a grant at now; in the next window it is counted in
//     a second count, the state's ahead, which becomes that window's count
//     when it comes (its requests queue behind the reserved hits). A wait
//     is always to the next window: one past it is refused.
//
// Post-paid policies (Overdraft) and stacks of several tiers are never
// reserved: a burst of a later request into a higher tier would not count
// hits reserved in a lower one. CanPace says which policies pace.

// ErrCannotPace is wrapped by CanPace's error.
var ErrCannotPace = errors.New("tiers: cannot pace")

// CanPace reports whether p's rejections can be paced: nil for a policy of
// one tier (a rate_limit), with or without hard and global limits, a token
// bucket, a fixed window and a calendar quota; an error wrapping
// ErrCannotPace saying why for a stack of several tiers, a post-paid
// policy and a concurrency limit.
func CanPace(p *Policy) error {
	if p == nil {
		return fmt.Errorf("%w: no policy", ErrCannotPace)
	}
	if p.Overdraft {
		return fmt.Errorf("%w: a post-paid (overdraft) policy counts usage after the fact", ErrCannotPace)
	}
	if p.Concurrency {
		return fmt.Errorf("%w: a concurrency limit's slots come back when requests end, which no wait can foresee", ErrCannotPace)
	}
	switch p.Kind {
	case KindTiers:
		if numTiers(p) != 1 {
			return fmt.Errorf("%w: a stack of several tiers cannot keep a reservation across a burst (pace one tier or a token bucket)", ErrCannotPace)
		}
		return nil
	case KindTokenBucket, KindFixedWindow, KindQuota:
		return nil
	}
	return fmt.Errorf("%w: unknown kind %v", ErrCannotPace, p.Kind)
}

// Reserve decides at now a request of copies hits (at least min) to be
// granted at the later instant at, and commits the reservation into s and g
// (pacing: see above). It answers what Request answers at at, when the
// reservation is granted; when at is refused by the rules above it answers
// a rejection with RetryAfter Unbounded (no later instant can be reserved
// either); a rejection at at has its RetryAfter counted from at. at not
// after now is Request at now. A rejection changes nothing.
func Reserve(p *Policy, s *State, g *Global, now, at time.Time, copies, min int64) Decision {
	return reserve(p, s, g, now.UnixMicro(), at.UnixMicro(), copies, min, true)
}

// PeekReserve returns what Reserve would, changing nothing.
func PeekReserve(p *Policy, s *State, g *Global, now, at time.Time, copies, min int64) Decision {
	return reserve(p, s, g, now.UnixMicro(), at.UnixMicro(), copies, min, false)
}

func reserve(p *Policy, s *State, g *Global, now, t, k, m int64, commit bool) Decision {
	if t <= now {
		return decide(p, s, g, now, k, m, commit)
	}
	if p == nil || s == nil {
		return closed()
	}
	k, m = clampCopies(k), clampCopies(m)
	var d Decision
	switch {
	case p.Overdraft:
		d = closed()
	case p.Kind == KindTiers:
		d = reserveTiers(p, s, g, now, t, k, m, commit)
	case p.Kind == KindTokenBucket:
		d = reserveBucket(p, s, now, t, k, m, commit)
	case p.Kind == KindFixedWindow, p.Kind == KindQuota:
		d = reserveFixed(p, s, now, t, k, m, commit)
	default:
		return closed()
	}
	p.FillLimits(&d)
	return d
}

// reserveTiers is reserve for a policy of one tier.
func reserveTiers(p *Policy, s *State, g *Global, now, t, k, m int64, commit bool) Decision {
	if numTiers(p) != 1 {
		return closed()
	}
	// The tier active at now and at t, or never entered and active for ever.
	fresh := (len(s.tiers) == 0 || !s.tiers[0].in) && p.Tiers[0].Active == Unbounded
	if !fresh && (phase(p, s, 1, now) != active || phase(p, s, 1, t) != active) {
		return closed()
	}
	d := decideTiers(p, s, g, t, k, m, false)
	if !d.OK || !commit || d.Granted == 0 {
		return d
	}
	var w walker
	w.init(p, s, g, t)
	c0, cnt0 := w.c, w.cnt
	w.run(k)
	applyTiersAt(p, s, g, now, t, c0, cnt0, &w)
	return d
}

// reserveBucket is reserve for a token bucket.
func reserveBucket(p *Policy, s *State, now, t, k, m int64, commit bool) Decision {
	unit, r, capU, ok := bucketUnits(&p.Bucket)
	if !ok {
		return closed()
	}
	d := decideBucket(p, s, t, k, m, false)
	if !d.OK {
		return d
	}
	// The balance at t after the grant, carried back to now: between now
	// and t the wait repays the debt, and at t the bucket holds what it
	// would had the hits been taken at t (a bucket full before t has lost
	// what overflowed, so the reservation cannot keep it).
	bt := balance(s, t, unit, r, capU)
	b := bt - d.Granted*unit - r*(t-now)
	if b < -capU {
		return closed()
	}
	if commit && d.Granted > 0 {
		room := roomOf(s, unit, capU)
		if now >= s.ahead {
			// Nothing is pending: no give-back can come before this one.
			room = capU
		}
		s.ahead = max(s.ahead, t)
		setBucket(s, b, max(s.at, now), unit, capU)
		s.room = min(room, capU-bt)
	}
	return d
}

// refundReservedBucket gives back, at now, up to hits of a reservation for
// t: all of them when no reservation pending is for a later instant than
// t, else at most the room (see doc.go, "Pacing"), which each give-back
// uses up. A reservation already due (t not after now) gives nothing back.
func refundReservedBucket(p *Policy, s *State, now, t, hits int64) {
	unit, r, capU, ok := bucketUnits(&p.Bucket)
	if !ok || hits <= 0 || !s.used || t <= now {
		return
	}
	give := min(hits, p.Bucket.Capacity) * unit
	room := roomOf(s, unit, capU)
	if t < s.ahead {
		give = min(give, room)
	}
	if give <= 0 {
		return
	}
	b := balance(s, now, unit, r, capU)
	setBucket(s, min(capU, b+give), max(s.at, now), unit, capU)
	s.room = max(0, room-give)
}

// reserveFixed is reserve for a fixed window or a calendar quota: within
// the window (period) holding now, a grant at now; in the next one, a
// grant counted in s.ahead, that window's count once it comes. A
// rejection is a refusal: the wait is to a window after the next.
func reserveFixed(p *Policy, s *State, now, t, k, m int64, commit bool) Decision {
	start, length, cnt := fixedWindow(p, s, now)
	if t < start+length {
		if d := decideFixed(p, s, now, k, m, commit); d.OK {
			return d
		}
		return closed()
	}
	if end, _ := nextWindow(p, start+length); t >= end {
		return closed()
	}
	// The next window's count: the state's ahead when it is now's window.
	next := State{used: true, at: start + length}
	if s.used && s.at == start {
		next.val = s.ahead
	}
	d := decideFixed(p, &next, t, k, m, commit)
	if !d.OK {
		return closed()
	}
	if commit && d.Granted > 0 {
		setWindow(s, start, cnt)
		s.ahead = next.val
	}
	return d
}

// RefundReserved gives back, at now, up to hits of a reservation made for
// the instant at (a paced request that gave up waiting): for KindTiers the
// hits stamped at at (or, when they joined a newer bucket, that bucket's)
// leave the tier's and the per-second logs; a window gets its count back
// (that of the window holding at); a token bucket gets back what a run
// without the reservation would hold (see above). hits <= 0, a nil p or a
// nil s change nothing.
func RefundReserved(p *Policy, s *State, g *Global, now, at time.Time, hits int64) {
	if p == nil || s == nil {
		return
	}
	n, t, hits := now.UnixMicro(), at.UnixMicro(), clampCopies(hits)
	switch p.Kind {
	case KindTokenBucket:
		refundReservedBucket(p, s, n, t, hits)
		return
	case KindFixedWindow, KindQuota:
		if start, length, _ := fixedWindow(p, s, n); t >= start+length {
			// Reserved in the next window.
			if hits > 0 && s.used && s.at == start {
				s.ahead = max(0, s.ahead-hits)
			}
			return
		}
		Refund(p, s, g, now, hits)
		return
	}
	if hits <= 0 || numTiers(p) < 1 || len(s.tiers) < 1 {
		return
	}
	tr := &p.Tiers[0]
	win := Micros(tr.Window)
	done := s.tiers[0].hits.removeAt(n, t, win, tierWidth(tr.Limit, win, s.exact), hits)
	s.second.removeAt(n, t, second, secondWidth(p.HardLimit, s.exact), done)
	if g != nil {
		g.second.removeAt(n, t, second, secondWidth(p.GlobalLimit, g.exact), done)
	}
}
