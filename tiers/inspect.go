package tiers

import (
	"fmt"
	"strings"
	"time"
)

// Phase is a tier's phase at an instant.
type Phase uint8

// Phases.
const (
	// PhaseInactive: never entered, or its active period and cooldown are
	// over; a burst may enter it.
	PhaseInactive Phase = iota
	// PhaseActive: entered and within its active period.
	PhaseActive
	// PhaseCooldown: its active period is over; a burst passes over it if it
	// is skippable and stops at it otherwise.
	PhaseCooldown
)

func (p Phase) String() string {
	switch p {
	case PhaseActive:
		return "active"
	case PhaseCooldown:
		return "cooldown"
	}
	return "inactive"
}

// TierView is one tier of a View.
type TierView struct {
	Phase Phase
	// EnteredAt is when the tier was last entered (zero: never).
	EnteredAt time.Time
	// ActiveUntil and CooldownUntil end the tier's active period and its
	// cooldown (zero: never entered, or never ends).
	ActiveUntil, CooldownUntil time.Time
	// Hits is the number of hits counted in the tier's window at the instant.
	Hits int64
}

// View is what a pair's state means at one instant, for people: every tier's
// phase and count, the per-second counts, what a request would get, and the
// next instant at which that changes. Inspect computes it without changing
// the state.
type View struct {
	At   time.Time
	Kind Kind
	// Tier is the current tier (0: none active; 1 for a token bucket or a
	// fixed window).
	Tier int
	// Tiers has one entry per tier of a KindTiers policy.
	Tiers []TierView
	// DomainHits and ResourceHits count the pair's and the resource's hits of
	// the last second (KindTiers; ResourceHits needs the Global).
	DomainHits, ResourceHits int64
	// Used and Capacity: a token bucket's credits in use and its capacity; a
	// fixed window's count and limit; WindowEnd the fixed window's end.
	Used, Capacity int64
	WindowEnd      time.Time
	// Remaining is how many single hits would be granted now; RetryAfter,
	// when Remaining is 0, the wait before one hit would be (Unbounded:
	// never); ResetAfter, when Remaining is above 0, the time until it grows
	// (0: nothing pending). They are what a request of one hit would be told.
	Remaining              int64
	RetryAfter, ResetAfter time.Duration
	// Next is the next instant at which the state's meaning changes with no
	// traffic (zero: none); NextTier is the current tier from then.
	Next     time.Time
	NextTier int
	// Owed is, for a post-paid policy in debt, the hits counted beyond its
	// limit (the most over any of its limits; for a token bucket, the whole
	// credits below 0, rounded up); 0 otherwise.
	Owed int64
}

// owed returns View.Owed of s under p at t.
func owed(p *Policy, s *State, g *Global, t int64) int64 {
	if !p.Overdraft {
		return 0
	}
	var o int64
	switch p.Kind {
	case KindTiers:
		var w walker
		w.init(p, s, g, t)
		if w.c >= 1 {
			o = w.cnt - p.Tiers[w.c-1].Limit
		}
		if p.HardLimit > 0 {
			o = max(o, w.dom-p.HardLimit)
		}
		if p.GlobalLimit > 0 {
			o = max(o, w.glob-p.GlobalLimit)
		}
	case KindTokenBucket:
		if unit, r, capU, ok := bucketUnits(&p.Bucket); ok {
			if b := balance(s, t, unit, r, capU); b < 0 {
				o = ceilDiv(-b, unit)
			}
		}
	case KindFixedWindow, KindQuota:
		if lim, known := windowLimit(p); known {
			_, _, cnt := fixedWindow(p, s, t)
			o = cnt - lim
		}
	}
	return max(o, 0)
}

// Inspect returns the view of s (and g, for the resource's hits) under p at
// now, changing neither. A nil p or s reads as a fresh state.
func Inspect(p *Policy, s *State, g *Global, now time.Time) View {
	if s == nil {
		s = new(State)
	}
	t := now.UnixMicro()
	v := View{At: now}
	if p == nil {
		return v
	}
	v.Kind = p.Kind
	v.Owed = owed(p, s, g, t)
	check := decide(p, s, g, t, 0, 0, false)
	v.Remaining = check.Remaining
	v.Tier = check.Tier
	v.DomainHits, v.ResourceHits = check.DomainHits, check.ResourceHits
	if v.Remaining > 0 {
		v.ResetAfter = check.ResetAfter
	} else {
		v.RetryAfter = decide(p, s, g, t, 1, 1, false).RetryAfter
	}
	var next int64
	var ok bool
	switch p.Kind {
	case KindTiers:
		v.Tiers = make([]TierView, numTiers(p))
		for i := range v.Tiers {
			tv := &v.Tiers[i]
			tv.Phase = Phase(phase(p, s, i+1, t))
			if i >= len(s.tiers) || !s.tiers[i].in {
				continue
			}
			ts, tr := &s.tiers[i], &p.Tiers[i]
			tv.EnteredAt = time.UnixMicro(ts.entered)
			end := addSat(ts.entered, Micros(tr.Active))
			if end != inf {
				tv.ActiveUntil = time.UnixMicro(end)
				tv.CooldownUntil = time.UnixMicro(addSat(end, max(0, Micros(tr.Cooldown))))
			}
			tv.Hits = ts.hits.count(t, Micros(tr.Window))
		}
		if v.Tier == 0 || v.Tiers[v.Tier-1].Hits == 0 {
			v.ResetAfter = 0 // nothing counted: nothing pending
		}
		next, ok = nextEvent(p, s, g, t)
	case KindTokenBucket:
		v.Used, v.Capacity = check.TierHits, p.Bucket.Capacity
		if d := check.ResetAfter; d > 0 && d != Unbounded {
			next, ok = t+Micros(d), true
		}
	case KindFixedWindow, KindQuota:
		lim, known := windowLimit(p)
		v.Used, v.Capacity = check.TierHits, lim
		if known {
			start, length, _ := fixedWindow(p, s, t)
			v.WindowEnd = time.UnixMicro(start + length)
			if v.Used > 0 {
				next, ok = start+length, true
			}
		}
	}
	if ok && next != inf {
		v.Next = time.UnixMicro(next)
		v.NextTier = decide(p, s, g, next, 0, 0, false).Tier
	}
	return v
}

// Summary says in words what v means under p: what a request gets now and
// the next change, e.g. "tier 2 of 2 (10 per 1s): 3 more hits now; tier 2
// cools down in 12s, then tier 1: 5 per 1s".
func (v *View) Summary(p *Policy) string {
	if p == nil {
		return "not limited"
	}
	var b strings.Builder
	switch p.Kind {
	case KindTiers:
		switch {
		case numTiers(p) == 0:
			b.WriteString("closed: no tier grants anything")
			return b.String()
		case v.Tier == 0 && v.Remaining > 0 && v.Tiers[0].Phase != PhaseCooldown:
			b.WriteString("no tier active (the next request enters tier 1)")
		case v.Tier == 0:
			// Rejecting, or tier 1 cooling down: the next request may
			// enter another tier, or none.
			b.WriteString("no tier active")
		default:
			fmt.Fprintf(&b, "tier %d of %d (%s)", v.Tier, numTiers(p), rate(&p.Tiers[v.Tier-1]))
		}
		if v.Tier > 0 {
			fmt.Fprintf(&b, ", %s in its window", hits(v.Tiers[v.Tier-1].Hits))
		}
		if p.HardLimit > 0 {
			fmt.Fprintf(&b, "; hard limit %d per second, %d used", p.HardLimit, v.DomainHits)
		}
		if p.GlobalLimit > 0 {
			fmt.Fprintf(&b, "; global limit %d per second, %d used", p.GlobalLimit, v.ResourceHits)
		}
	case KindTokenBucket:
		fmt.Fprintf(&b, "token bucket: %d of %d credits used", v.Used, v.Capacity)
	case KindFixedWindow:
		fmt.Fprintf(&b, "fixed window: %d of %d used in this %s", v.Used, v.Capacity, p.Window.Unit)
	case KindQuota:
		fmt.Fprintf(&b, "quota: %d of %d used in this %s (ends %s)", v.Used, v.Capacity, p.Quota.Period, v.WindowEnd.In(p.Quota.loc()).Format(time.RFC3339))
	}
	if v.Owed > 0 {
		fmt.Fprintf(&b, " (post-paid: %s owed)", hits(v.Owed))
	}
	b.WriteString(": ")
	switch {
	case v.Remaining > 0:
		if v.Remaining == 1 {
			b.WriteString("1 more hit now")
		} else {
			fmt.Fprintf(&b, "%d more hits now", v.Remaining)
		}
	case v.RetryAfter == Unbounded:
		b.WriteString("rejecting, and no wait helps")
	default:
		fmt.Fprintf(&b, "rejecting for %s", round(v.RetryAfter))
	}
	if v.Next.IsZero() {
		return b.String()
	}
	in := round(v.Next.Sub(v.At))
	b.WriteString("; ")
	switch p.Kind {
	case KindTiers:
		b.WriteString(v.nextTierEvent(p, in))
	case KindTokenBucket:
		fmt.Fprintf(&b, "next credit in %s", in)
	case KindFixedWindow:
		fmt.Fprintf(&b, "the window resets in %s", in)
	case KindQuota:
		fmt.Fprintf(&b, "the quota renews in %s", in)
	}
	return b.String()
}

// nextTierEvent words the change at v.Next.
func (v *View) nextTierEvent(p *Policy, in time.Duration) string {
	var what string
	for i, tv := range v.Tiers {
		switch {
		case tv.Phase == PhaseActive && tv.ActiveUntil.Equal(v.Next):
			if p.Tiers[i].Cooldown > 0 {
				what = fmt.Sprintf("tier %d cools down in %s", i+1, in)
			} else {
				what = fmt.Sprintf("tier %d ends in %s", i+1, in)
			}
		case tv.Phase == PhaseCooldown && tv.CooldownUntil.Equal(v.Next):
			what = fmt.Sprintf("tier %d can be entered again in %s", i+1, in)
		}
		if what != "" {
			break
		}
	}
	if what == "" {
		what = fmt.Sprintf("hits leave a window in %s", in)
	}
	switch {
	case v.NextTier == v.Tier:
		return what
	case v.NextTier == 0:
		return what + ", then no tier is active"
	default:
		return fmt.Sprintf("%s, then tier %d: %s", what, v.NextTier, rate(&p.Tiers[v.NextTier-1]))
	}
}

// rate words a tier's limit, e.g. "5 per 1s".
func rate(t *Tier) string {
	return fmt.Sprintf("%d per %s", t.Limit, t.Window)
}

// hits words n hits.
func hits(n int64) string {
	if n == 1 {
		return "1 hit"
	}
	return fmt.Sprintf("%d hits", n)
}

// round rounds d to the millisecond for people, when it is that long.
func round(d time.Duration) time.Duration {
	if d >= time.Millisecond {
		return d.Round(time.Millisecond)
	}
	return d
}
