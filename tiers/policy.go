package tiers

import (
	"math"
	"time"
)

// Unbounded is an active period that never ends.
const Unbounded time.Duration = math.MaxInt64

// Kind names the algorithm a Policy uses.
type Kind uint8

const (
	// KindTiers is the Charon burst-tier stack (SPEC §2), with optional hard and
	// global limits. A Lyft rate_limit {unit, requests_per_unit} is one tier with
	// an unbounded active period and no cooldown.
	KindTiers Kind = iota
	// KindTokenBucket is a credit pool: Bucket.Capacity credits, refilled
	// continuously at Bucket.Refill per Bucket.Per.
	KindTokenBucket
	// KindFixedWindow is envoyproxy/ratelimit's calendar-aligned fixed window.
	KindFixedWindow
	// KindQuota is a calendar quota: Quota.Limit hits per calendar period
	// (Quota), counted as a fixed window is.
	KindQuota
)

// String is the kind's name in configuration and in answers: "tiers",
// "token_bucket" or "fixed_window".
func (k Kind) String() string {
	switch k {
	case KindTokenBucket:
		return "token_bucket"
	case KindFixedWindow:
		return "fixed_window"
	case KindQuota:
		return "quota"
	}
	return "tiers"
}

// Unit is a fixed-window unit, with envoyproxy/ratelimit's names and lengths.
type Unit uint8

// Units accepted by envoyproxy/ratelimit's config.
const (
	UnitSecond Unit = iota + 1
	UnitMinute
	UnitHour
	UnitDay
	UnitWeek
	UnitMonth
	UnitYear
)

// Tier is one burst tier: at most Limit hits in any span of Window, active for
// Active once entered (Unbounded: forever), then in cooldown for Cooldown.
// A skippable tier in cooldown is passed over by a burst.
type Tier struct {
	Limit     int64
	Window    time.Duration
	Active    time.Duration
	Cooldown  time.Duration
	Skippable bool
}

// TokenBucket is a credit pool that starts full and refills continuously at
// Refill credits per Per, fractions accruing, never above Capacity.
type TokenBucket struct {
	Capacity int64
	Refill   int64
	Per      time.Duration
}

// FixedWindow grants at most Limit hits in each calendar-aligned window of
// one Unit.
type FixedWindow struct {
	Limit int64
	Unit  Unit
}

// Policy is the immutable limit of one (resource, domain) pair. Only the
// fields of its Kind are read. HardLimit and GlobalLimit (hits per second per
// domain, and over all domains of the resource; 0 means none) apply to
// KindTiers. A KindTiers policy with no tiers rejects every request.
// A Policy must not be changed once in use; it is safe for concurrent reads.
//
// Overdraft selects post-paid counting (doc.go, "Post-paid usage"): the hits
// of a request that does not fit are debited all the same, and while the
// state is in debt every request, a check of 0 hits included, is rejected.
// The zero value counts for admission: a rejected request consumes nothing.
//
// Concurrency makes a KindTiers policy of one tier, active for ever, with
// no cooldown, no hard or global limit and no Overdraft, a concurrency
// limit (doc.go, "Concurrency limits"): its hits are slots held by requests
// in flight, at most the tier's Limit at once; a refund gives back the
// slots a request took (RefundSlots), or with no more said the oldest
// slots held, never the newest; a slot no refund gives back frees itself
// when it leaves the tier's Window, the slots' time to live.
type Policy struct {
	Kind        Kind
	Tiers       []Tier
	HardLimit   int64
	GlobalLimit int64
	Bucket      TokenBucket
	Window      FixedWindow
	Quota       Quota
	Overdraft   bool
	Concurrency bool
}
