package tiers

import "time"

// Decision is the answer to one request, with the decision context of SPEC §2
// (paper §3.1). The zero value is a rejection of nothing.
type Decision struct {
	// Granted is the number of hits granted: 0 when the request was rejected.
	Granted int64
	// OK reports whether the request was granted (Granted >= min copies).
	OK bool
	// HardLimit and GlobalLimit echo the policy (0: none; always 0 for a
	// token bucket or a fixed window).
	HardLimit   int64
	GlobalLimit int64
	// Tier is the current tier index after the decision (0: the virtual tier,
	// whose TierLimit and TierWindow are 0); TierLimit and TierWindow its
	// limit and window. For a token bucket or a fixed window Tier is 1, and
	// TierLimit and TierWindow are the capacity and the time to refill it
	// fully, or the limit and the unit's length.
	Tier       int
	TierLimit  int64
	TierWindow time.Duration
	// TierHits is the number of hits in the current tier's window (for a token
	// bucket: credits in use, capacity minus whole credits left; for a fixed
	// window: hits in the current window).
	TierHits int64
	// DomainHits and ResourceHits count the domain's and the resource's (all
	// domains') hits in the last second, this request's included (KindTiers
	// only; ResourceHits is 0 when no Global was passed). Above a limit of 64
	// they are counted in buckets and may miss hits up to 1/64 s old; with no
	// hard or global limit to enforce (a count only reported) in buckets of
	// 1/8 s, missing hits up to 1/8 s old.
	DomainHits   int64
	ResourceHits int64
	// Burst reports whether the request entered a higher tier.
	Burst bool
	// LimitedByHard and LimitedByGlobal report that the hard or the global
	// limit stopped granting before copies were granted.
	LimitedByHard   bool
	LimitedByGlobal bool
	// Leased reports a decision this process made from its escrow leases
	// of the pair (package internal/escrow) without asking the shared
	// store: a grant of hits a lease held, or a rejection while the
	// pair's last lease was refused. The decision log says "escrow":
	// "local". Nothing in this package sets it; it sits in the padding
	// after the flags above, so a Decision is no larger for it.
	Leased bool
	// Remaining is how many more single hits would be granted at this instant.
	Remaining int64
	// RetryAfter is, when rejected, the earliest time from now at which the
	// same request (max(min copies, 1) hits) would be granted with no other
	// traffic; with min copies 1 this is SPEC §2's one-hit retry_after. It is
	// 0 when granted, and Unbounded when no wait suffices (a policy with no
	// tiers, min copies above copies, the hard or global limit, or a bucket's
	// capacity or a window's limit): a server then answers without a reset
	// time and clients should not retry.
	RetryAfter time.Duration
	// ResetAfter is, when granted, the time until Remaining next grows (the
	// oldest hit of the current tier's window leaves it, the fixed window ends,
	// the next whole credit accrues; 0 when nothing is pending, as for a full
	// bucket); when rejected, RetryAfter.
	ResetAfter time.Duration
	// SlotsAt is, for a concurrency limit (Policy.Concurrency) that granted
	// hits, the instant they were stamped with, on the clock of whatever
	// decided (the caller's now for package tiers, the Redis master's for
	// the Redis store): what RefundSlots takes to give back exactly these
	// slots. It is the zero Time for every other decision.
	SlotsAt time.Time
}

// Limiter names the limit a refusal came from: "hard", "global", or "tier"
// (the tiers, the token bucket or the fixed window of the policy). It
// means something only for a decision that is not OK.
func (d Decision) Limiter() string {
	switch {
	case d.LimitedByHard:
		return "hard"
	case d.LimitedByGlobal:
		return "global"
	}
	return "tier"
}
