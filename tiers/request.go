package tiers

import "time"

// Request decides, at now, a request of copies hits of which at least min
// must be granted, and commits a grant into s and g. A rejection changes
// nothing, unless p.Overdraft: then it debits the hits (doc.go). g carries the resource's hits of the last second for the global
// limit; it may be nil when the policy has no global limit (a nil g counts no
// other domain's hits, and ResourceHits is then 0).
//
// copies and min are clamped to [0, 2^50]. copies 0 asks nothing: the
// decision is granted, with the full context, and changes nothing. min 0
// accepts any grant, none included. min > copies is never granted.
//
// A nil p or s is rejected with RetryAfter Unbounded. Request does not
// allocate once s and g have grown to p's size.
func Request(p *Policy, s *State, g *Global, now time.Time, copies, min int64) Decision {
	return decide(p, s, g, now.UnixMicro(), copies, min, true)
}

// Peek returns exactly what Request would return for the same arguments,
// changing neither s nor g (but for the RetryAfter of a post-paid
// rejection, which Request computes after its debit: doc.go). A store
// checks every descriptor of a request with Peek and then commits them all
// with Request when all are granted.
func Peek(p *Policy, s *State, g *Global, now time.Time, copies, min int64) Decision {
	return decide(p, s, g, now.UnixMicro(), copies, min, false)
}

func decide(p *Policy, s *State, g *Global, t, k, m int64, commit bool) Decision {
	if p == nil || s == nil {
		return closed()
	}
	k, m = clampCopies(k), clampCopies(m)
	var d Decision
	switch p.Kind {
	case KindTiers:
		d = decideTiers(p, s, g, t, k, m, commit)
	case KindTokenBucket:
		d = decideBucket(p, s, t, k, m, commit)
	case KindFixedWindow, KindQuota:
		d = decideFixed(p, s, t, k, m, commit)
	default:
		return closed()
	}
	p.FillLimits(&d)
	return d
}

// needed is the number of hits whose grant a rejected request waits for:
// its minimum, at least one, except for a check of 0 hits, refused only by
// a post-paid state in debt, which waits for the debt to be repaid.
func needed(k, m int64) int64 {
	if k == 0 {
		return 0
	}
	return max(m, 1)
}

// closed is the answer of a policy that can never grant.
func closed() Decision {
	return Decision{RetryAfter: Unbounded, ResetAfter: Unbounded}
}

// Refund gives back up to hits previously granted hits (Envoy's
// is_negative_hits), at now:
//   - KindTiers: the newest hits of the current tier's window are removed
//     (hits of lower tiers, or of a tier no longer current, are not), and as
//     many of the newest hits of the last second from s and g; a tier once
//     entered stays entered. With no current tier nothing changes. A
//     concurrency limit (Policy.Concurrency) gives back its oldest slots
//     instead: the refunded request's own are at least as new, so every
//     request still in flight keeps a slot that lives at least as long as
//     its own (doc.go, "Concurrency limits").
//   - KindTokenBucket: hits credits are added, up to the capacity.
//   - KindFixedWindow: the current window's count is lowered by hits, not
//     below 0.
//
// hits <= 0, a nil p or a nil s change nothing.
func Refund(p *Policy, s *State, g *Global, now time.Time, hits int64) {
	if p == nil || s == nil {
		return
	}
	t, hits := now.UnixMicro(), clampCopies(hits)
	switch p.Kind {
	case KindTiers:
		refundTiers(p, s, g, t, -1, hits)
	case KindTokenBucket:
		refundBucket(p, s, t, hits)
	case KindFixedWindow, KindQuota:
		refundFixed(p, s, t, hits)
	}
}

// RefundSlots gives back up to hits slots of a concurrency limit that a
// request took at at (its grant's Decision.SlotsAt), at now: they are
// removed from the first bucket of the tier's log that starts at or after
// at's (the take's own, or an older one when time went backwards), and as
// many of the newest hits of the last second from s and g. Nothing is
// removed when at's bucket has left the window: the take's slots have
// already freed themselves, and removing newer ones would free the slots
// of requests still in flight. A zero at, or a policy that is not a
// concurrency limit, is Refund.
func RefundSlots(p *Policy, s *State, g *Global, now, at time.Time, hits int64) {
	if p == nil || s == nil || !p.Concurrency || at.IsZero() || p.Kind != KindTiers {
		Refund(p, s, g, now, hits)
		return
	}
	refundTiers(p, s, g, now.UnixMicro(), max(1, at.UnixMicro()), clampCopies(hits))
}

// ForgetAt returns the instant from which forgetting s (replacing it by a
// zero State) cannot change any decision under p, or the zero Time when s
// is already equivalent to a zero State. Stores use it as the expiry of the
// pair's key.
//
// It is Forever when a tier other than the first one with an Unbounded
// active period was entered (such a tier stays current for ever). For a first
// tier active for ever (a Lyft rate_limit), it is the instant its newest hit
// leaves its window: forgetting it then only makes the next request report
// Burst, as it re-enters the tier.
func ForgetAt(p *Policy, s *State) time.Time {
	if p == nil || s == nil {
		return time.Time{}
	}
	var at int64
	var ok bool
	switch p.Kind {
	case KindTiers:
		at, ok = forgetTiers(p, s)
	case KindTokenBucket:
		at, ok = forgetBucket(p, s)
	case KindFixedWindow, KindQuota:
		at, ok = forgetFixed(p, s)
	}
	if !ok {
		return time.Time{}
	}
	if at == inf {
		return Forever
	}
	return time.UnixMicro(at)
}
