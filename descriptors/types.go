package descriptors

import (
	"time"

	"strconv"

	"github.com/charonlimit/charon/tiers"
)

// Entry is one key/value of a request's descriptor.
type Entry struct {
	Key, Value string
}

// Group is a domain group of a copy-limited resource: its members together
// hold at most Limit copies.
type Group struct {
	Name    string
	Limit   int64
	Members []string
}

// Copies is the limit of a copy-limited resource (SPEC §4). A Copies is
// immutable once part of a Tree.
type Copies struct {
	// DomainLimit is the most copies one Charon domain may hold.
	DomainLimit int64
	// GlobalLimit is the most copies all domains together may hold; 0: none.
	GlobalLimit int64
	Groups      []Group
	// Overrides are domain-specific domain limits, keyed by Charon domain
	// (Match.Domain); nil when there are none.
	Overrides map[string]int64
}

// Limit is what a matched leaf carries. At most one of Unlimited, Policy and
// Copies is set (none: a limit of zero, every request rejected, only for a
// Policy-less leaf built by hand). A Limit is immutable once built.
type Limit struct {
	// Name is rate_limit.name (may be empty); Replaces the names it replaces.
	Name     string
	Replaces []string
	// Unlimited is rate_limit.unlimited: always granted.
	Unlimited bool
	// ShadowMode: decide and count, but answer OK.
	ShadowMode bool
	// Metadata is the descriptor's metadata (YAML values), reported back in
	// a response's dynamic metadata when the descriptor passes.
	Metadata map[string]any
	// QuotaMode: over its limit, the descriptor is OVER_LIMIT but the
	// request is only when every quota descriptor of it is (or another
	// descriptor is). ShadowMode comes first: a shadow quota descriptor is
	// OK, never over.
	QuotaMode bool
	// DetailedMetric puts the request value of every level in MetricKey
	// (see the package documentation); only a matched leaf's counts.
	DetailedMetric bool
	// Policy is the default rate policy; Overrides are per Charon domain.
	Policy    *tiers.Policy
	Overrides map[string]*tiers.Policy
	// Copies is set for a copy-limited resource.
	Copies *Copies
	// Pace is the longest a request over the limit may be held and then
	// granted instead of rejected (pace: in the configuration), 0 for none:
	// the engine reserves its grant and answers it then (tiers.Reserve).
	// It is how answers are given, not how hits are counted: it is not part
	// of ID. Only a policy tiers.CanPace allows carries it.
	Pace time.Duration
	// Escrow is the descriptor's escrow: setting (SPEC §10): whether its
	// pairs may be decided from escrow leases when hot, or the server's
	// default (--escrow) when it does not say. Like Pace it is how answers
	// are given, not how hits are counted: it is not part of ID.
	Escrow Escrow
	// Quota is the descriptor's calendar quota (a tiers.KindQuota policy),
	// nil when it has none: a request must pass it and Policy (when set),
	// all or nothing. Its state is keyed by QuotaID, the quota's shape
	// (tiers.Policy.Shape: its period, zone and anchor, not its limit), so
	// that a change of the rate policy or of the quota's limit keeps the
	// quota's count; NewTree computes QuotaID when it is 0.
	Quota   *tiers.Policy
	QuotaID uint64
	// Shape is Policy's shape (tiers.Policy.Shape): with the resource and
	// the Charon domain it keys a pair's state, so that a change of the
	// limits keeps the counts made (SPEC §3, counts belong to the rule)
	// and a change of shape starts afresh. OverrideShapes are the shapes
	// of Overrides, by domain (Match.Shape). NewTree computes Shape when
	// it is 0 and OverrideShapes when it is nil.
	Shape          uint64
	OverrideShapes map[string]uint64
	// ID identifies the policy set (Policy, Overrides, Copies) with its
	// numbers: it changes exactly when one of them changes. It names the
	// policy set (config dumps, RLQS budgets); stores key rate state by
	// Shape, not by ID. NewTree computes it when it is 0.
	ID uint64
	// File and Line locate the leaf in the config (Line 0: a file written
	// by a program, an xDS resource's, whose lines mean nothing to people).
	File string
	Line int
}

// Escrow is a descriptor's escrow: setting.
type Escrow int8

// The escrow settings.
const (
	// EscrowDefault: the descriptor does not say; the server's --escrow
	// decides.
	EscrowDefault Escrow = iota
	// EscrowOn: escrow: true.
	EscrowOn
	// EscrowOff: escrow: false.
	EscrowOff
)

// Where is where the limit is written: "file:line", or the file alone when
// it has no line; "" when unknown. Every place that names a rule to people
// (explain, attribution, top, dumps, diffs) says it so.
func (l *Limit) Where() string {
	switch {
	case l.File == "":
		return ""
	case l.Line <= 0:
		return l.File
	}
	return l.File + ":" + strconv.Itoa(l.Line)
}

// Match is the result of matching one request descriptor. The zero value is
// "not limited".
type Match struct {
	// Limit is the matched leaf's limit (nil: not limited).
	Limit *Limit
	// Policy is the effective rate policy: the override for Domain if any,
	// else Limit.Policy.
	Policy *tiers.Policy
	// Shape is Policy's shape (tiers.Policy.Shape), computed when the tree
	// was built: a store keys the pair's state by (Resource, Domain,
	// Shape).
	Shape uint64
	// Resource is the RLS domain plus the path of matched keys and fixed
	// values; Domain the joined values of key-only and wildcard entries.
	// Both are escaped, bounded in length and safe as Redis key parts (see
	// the package documentation for the exact format).
	Resource string
	Domain   string
	// MetricKey is envoyproxy/ratelimit's stat key for the descriptor
	// (e.g. "domain.key_value.key2"), values only with detailed_metric.
	MetricKey string
	// Replaced is set by ApplyReplaces.
	Replaced bool
}

// DomainConfig is the per RLS domain configuration.
type DomainConfig struct {
	Name string
	// IgnoreLimits is the kill switch: grant everything, still record.
	IgnoreLimits bool
	// AllowUnconfigured grants (and records) a request matching no leaf.
	AllowUnconfigured bool
	// CalendarUnits is the zone whose calendar the units day, week, month
	// and year follow in the domain (calendar_units, --calendar-units):
	// the config's limits are built so, and a request's own limit in one
	// of those units is counted per calendar period too. nil: the units'
	// fixed lengths.
	CalendarUnits *time.Location
}
