package tiers

import "time"

// Decision is the answer to one request, with the decision context of SPEC §2
// (paper §3.1). The zero value is a rejection of nothing.
type Decision struct {
	// Granted is the number of hits granted: 0 when the request was rejected.
	Granted int64
	// OK reports whether the request was granted (Granted >= min copies).
	OK bool
	// HardLimit and GlobalLimit echo the policy (0: none).
	HardLimit   int64
	GlobalLimit int64
	// Tier is the current tier index after the decision (0: the virtual tier);
	// TierLimit and TierWindow its limit and window. For a token bucket they
	// are the capacity and the time to refill it fully; for a fixed window its
	// limit and unit length.
	Tier       int
	TierLimit  int64
	TierWindow time.Duration
	// TierHits is the number of hits in the current tier's window (for a token
	// bucket: credits in use, capacity minus whole credits left; for a fixed
	// window: hits in the current window).
	TierHits int64
	// DomainHits and ResourceHits count the domain's and the resource's (all
	// domains') hits in the last second, this request's included.
	DomainHits   int64
	ResourceHits int64
	// Burst reports whether the request entered a higher tier.
	Burst bool
	// LimitedByHard and LimitedByGlobal report that the hard or the global
	// limit stopped granting.
	LimitedByHard   bool
	LimitedByGlobal bool
	// Remaining is how many more single hits would be granted at this instant.
	Remaining int64
	// RetryAfter is, when rejected, the earliest time from now at which a
	// one-hit request would be granted with no other traffic; 0 when granted.
	// Unbounded when no wait suffices (a policy with no tiers).
	RetryAfter time.Duration
	// ResetAfter is, when granted, the time until Remaining next grows (the
	// oldest hit of the current tier's window leaves it, the fixed window ends,
	// the next whole credit accrues); when rejected, RetryAfter.
	ResetAfter time.Duration
}
