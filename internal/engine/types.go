package engine

import (
	"time"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/tiers"
)

// Override is a request descriptor's own limit (Envoy's RateLimitOverride):
// a one-tier sliding window of RequestsPerUnit hits per Multiplier units.
// RequestsPerUnit 0 rejects every request.
type Override struct {
	RequestsPerUnit uint32
	Unit            tiers.Unit
	Multiplier      uint32 // 0 or 1: one unit
}

// Descriptor is one descriptor of a request.
type Descriptor struct {
	Entries []descriptors.Entry
	// Hits, when HasHits, overrides the request's hits for this descriptor
	// (0 counts as 1).
	Hits    uint64
	HasHits bool
	// Refund gives Hits back instead of taking them (is_negative_hits).
	Refund bool
	// SlotsAt names, for a refund, the take whose slots it gives back when
	// the descriptor's limit is a concurrency limit: the SlotsAt of that
	// request's Response, sent back as a last entry of key SlotKey
	// (ShouldRateLimit reads it off; Decide sets this). The zero Time
	// gives back the oldest slots held.
	SlotsAt  time.Time
	Override *Override
}

// SlotKey is the key of the entry that names, at the end of a refund's
// descriptor, the take whose slots it gives back: the take's
// Response.SlotsAt in whole microseconds since the Unix epoch, in decimal,
// as Envoy's stream-done rate limit reads it from the dynamic metadata the
// take's answer set (a metadata action). It is read off before the
// descriptor is matched, and only from a refund's descriptor.
const SlotKey = "charon_slot"

// Request is one ShouldRateLimit call.
type Request struct {
	Domain      string
	Descriptors []Descriptor
	Hits        uint32 // 0 means 1
}

// Code is a descriptor's or a request's answer.
type Code uint8

// Codes. The engine never answers anything else (in particular never
// Envoy's UNKNOWN).
const (
	CodeOK Code = iota + 1
	CodeOverLimit
)

// CurrentLimit is the limit reported to Envoy: the current tier's limit per
// Multiplier Units. Multiplier is 0 for one unit.
type CurrentLimit struct {
	RequestsPerUnit uint32
	Unit            tiers.Unit
	Multiplier      uint32 // 0 or 1: one unit
	// Name is the rate_limit name, or, for a multi-tier policy or a window
	// that is not one unit, a description such as "5 per 2s, tier 1".
	Name string
}

// Status is the answer for one descriptor.
type Status struct {
	Code Code
	// Limit is nil when the descriptor is not limited (unknown domain, no
	// match, unlimited, replaced, or a copy-limited resource).
	Limit      *CurrentLimit
	Remaining  uint32
	ResetAfter time.Duration
	// Shadow is set when the limit would have rejected but shadow mode or
	// ignore_limits answered OK.
	Shadow bool
	// Quota is set for a limited descriptor in quota mode (quota_mode, or
	// Options.QuotaMode): its OVER_LIMIT makes the request OVER_LIMIT only
	// when every quota descriptor of it is.
	Quota bool
	// Decision is the store's answer (zero when not limited). When the
	// request as a whole was over the limit, the granted descriptors' answers
	// are what would have been granted: nothing was committed.
	Decision tiers.Decision
	// Match is the descriptor's match (zero Limit: none).
	Match descriptors.Match
	// Unconfigured is set for a descriptor that matched nothing in a
	// domain with allow_unconfigured: granted, and to be recorded.
	Unconfigured bool
	// By says which limit of the descriptor the answer (Code, Remaining,
	// ResetAfter, Decision, Limit) is about: ByRate, its rate policy, or
	// ByQuota, its calendar quota (descriptors.Limit.Quota). A descriptor
	// with both answers with the one that rejected (the longer wait when
	// both did), else the one with fewer hits remaining. Empty when the
	// descriptor is not limited.
	By LimitKind
	// PeriodEnd is, when the descriptor has a calendar quota, the end of
	// the quota's current period (its renewal), and QuotaDecision the
	// quota's own decision; zero otherwise.
	PeriodEnd     time.Time
	QuotaDecision tiers.Decision
}

// LimitKind names the kind of limit an answer is about.
type LimitKind string

// The kinds of limit of a descriptor.
const (
	ByRate  LimitKind = "rate"
	ByQuota LimitKind = "quota"
)

// Response is the answer to a Request, statuses in request order.
// The Limit pointers of its statuses point into the Response itself.
type Response struct {
	Code Code
	// Now is the instant the request was decided at, on the Engine's
	// clock.
	Now time.Time
	// Paced is how long the request was held before its grant (pace: in
	// the configuration), 0 when it was answered at once; Now is then the
	// instant it was granted at, the wait after the instant it came, on
	// the store's clock (Redis's own, by default, for the Redis store).
	Paced time.Duration
	// UnknownDomain is set when the request's domain has no configuration
	// (envoyproxy/ratelimit's domain_not_found).
	UnknownDomain bool
	// Slots is the number of slots the request holds in concurrency limits
	// (tiers.Policy.Concurrency) once answered, the fewest of its
	// concurrency descriptors', and SlotsAt the instant they were stamped
	// with (the earliest), on the store's clock; 0 and the zero Time when
	// it holds none (no concurrency limit, a rejection that committed
	// nothing, a store that answered without keeping them) or when one of
	// its concurrency descriptors took none (a shadow limit over its
	// slots, a check of 0 hits), since the refund goes to each. A
	// refund of Slots hits naming SlotsAt (Descriptor.SlotsAt) gives them
	// back: what Envoy's stream-done rate limit sends when it reads them
	// from the answer's dynamic metadata, which holds them only then.
	Slots    int64
	SlotsAt  time.Time
	Statuses []Status
	limits   []CurrentLimit
}
