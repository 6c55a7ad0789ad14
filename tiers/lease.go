package tiers

import (
	"errors"
	"fmt"
	"time"
)

// Escrow leases (SPEC §10): a replica may take a slice of a pair's budget,
// have the shared store count it at once, and grant it locally for a short
// while. A lease of a sliding window is a reservation (Reserve) for the
// lease's last instant, so that its hits are stamped no earlier than any
// instant they are granted at and no window forgets them early; what the
// reservation's walk at that later instant does not see (the hits that
// leave the window before it) is checked at the present once the
// reservation is committed, and the excess given back (package
// internal/escrow says the protocol and why it is exact).
//
// LeaseRatio is how much shorter than a policy's shortest window its
// leases must be: a lease's hits are counted from the moment it is taken
// until its end plus the window, so a lease of a twentieth of the window
// counts a hit at most 5% longer than it is used (lease holders at 90% of
// a limit then leave room for the unused part of their leases).
const LeaseRatio = 20

// MinLease is the shortest lease: a policy whose shortest window is under
// LeaseRatio of it is not leased.
const MinLease = time.Millisecond

// ErrCannotLease is wrapped by CanLease's error.
var ErrCannotLease = errors.New("tiers: cannot lease")

// CanLease reports whether a pair under p can be decided from escrow leases
// of length lease: nil for a policy of one tier that stays active for ever
// (a rate_limit), with or without hard and global limits, whose shortest
// window (the tier's; one second with a hard or a global limit) is at least
// LeaseRatio times lease; otherwise an error wrapping ErrCannotLease that
// says why. A token bucket, a fixed window and a calendar quota are not
// leased yet (their reservations are exact for an answer at the reserved
// instant, not for answers spread before it); a stack of several tiers, a
// tier with an active period, and a post-paid policy never are (a burst, a
// phase change or a debt would have to be decided by the shared state).
func CanLease(p *Policy, lease time.Duration) error {
	switch {
	case p == nil:
		return fmt.Errorf("%w: no policy", ErrCannotLease)
	case lease <= 0:
		return fmt.Errorf("%w: a lease must last some time", ErrCannotLease)
	case p.Overdraft:
		return fmt.Errorf("%w: a post-paid (overdraft) policy counts usage after the fact", ErrCannotLease)
	case p.Concurrency:
		return fmt.Errorf("%w: a concurrency limit's slots are given back by refunds that name their take", ErrCannotLease)
	}
	switch p.Kind {
	case KindTiers:
	case KindTokenBucket:
		return fmt.Errorf("%w: a token_bucket is not leased yet", ErrCannotLease)
	case KindFixedWindow, KindQuota:
		return fmt.Errorf("%w: a fixed window or a quota is not leased yet", ErrCannotLease)
	default:
		return fmt.Errorf("%w: unknown kind %v", ErrCannotLease, p.Kind)
	}
	switch n := numTiers(p); {
	case n == 0:
		return fmt.Errorf("%w: no tiers (every request is rejected)", ErrCannotLease)
	case n > 1:
		return fmt.Errorf("%w: a stack of several tiers bursts on the shared state", ErrCannotLease)
	}
	tr := &p.Tiers[0]
	if tr.Active != Unbounded {
		return fmt.Errorf("%w: a tier with an active period changes phase on the shared state", ErrCannotLease)
	}
	w := leaseWindow(p)
	if w < LeaseRatio*lease {
		return fmt.Errorf("%w: the window %v is shorter than %d leases of %v", ErrCannotLease, w, LeaseRatio, lease)
	}
	return nil
}

// LeaseFor returns the length of p's leases when no lease may be longer
// than longest: a LeaseRatio-th of its shortest window, at most longest;
// or, when p cannot be leased (CanLease's reasons, or a window under
// LeaseRatio shortest leases), an error wrapping ErrCannotLease that says
// why.
func LeaseFor(p *Policy, longest time.Duration) (time.Duration, error) {
	if err := CanLease(p, MinLease); err != nil {
		if p != nil && p.Kind == KindTiers && numTiers(p) == 1 && !p.Overdraft && p.Tiers[0].Active == Unbounded {
			return 0, fmt.Errorf("%w: the window %v is shorter than %d leases of the shortest, %v", ErrCannotLease, leaseWindow(p), LeaseRatio, MinLease)
		}
		return 0, err
	}
	return max(min(longest, leaseWindow(p)/LeaseRatio), MinLease), nil
}

// leaseWindow returns the shortest window a policy of one tier counts hits
// over: its tier's, or one second when it has a hard or a global limit.
func leaseWindow(p *Policy) time.Duration {
	w := p.Tiers[0].Window
	if (p.HardLimit > 0 || p.GlobalLimit > 0) && time.Second < w {
		w = time.Second
	}
	return w
}
