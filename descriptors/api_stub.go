package descriptors

import "github.com/charonlimit/charon/tiers"

// This file fixes the package's surface while it is being written; its
// declarations move to their own files.

// Entry is one key/value of a request's descriptor.
type Entry struct {
	Key, Value string
}

// Group is a domain group of a copy-limited resource.
type Group struct {
	Name    string
	Limit   int64
	Members []string
}

// Copies is the limit of a copy-limited resource (SPEC §4).
type Copies struct {
	DomainLimit int64
	GlobalLimit int64 // 0: none
	Groups      []Group
}

// Limit is what a matched leaf carries. Exactly one of Unlimited, Policy and
// Copies is set. A Limit is immutable once built.
type Limit struct {
	// Name is rate_limit.name (may be empty); Replaces the names it replaces.
	Name     string
	Replaces []string
	// Unlimited is rate_limit.unlimited: always granted.
	Unlimited bool
	// ShadowMode: decide and count, but answer OK.
	ShadowMode     bool
	DetailedMetric bool
	// Policy is the default rate policy; Overrides are per Charon domain.
	Policy    *tiers.Policy
	Overrides map[string]*tiers.Policy
	// Copies is set for a copy-limited resource.
	Copies *Copies
	// ID identifies the policy set (Policy, Overrides, Copies): it changes
	// exactly when one of them changes, so stores key state by it and a reload
	// keeps the state of unchanged resources.
	ID uint64
	// File and Line locate the leaf in the config.
	File string
	Line int
}

// Match is the result of matching one request descriptor.
type Match struct {
	// Limit is the matched leaf's limit (nil: not limited).
	Limit *Limit
	// Policy is the effective rate policy: the override for Domain if any,
	// else Limit.Policy.
	Policy *tiers.Policy
	// Resource is the RLS domain plus the path of matched keys and fixed
	// values; Domain the joined values of key-only and wildcard entries.
	// Both are escaped, bounded in length and safe as Redis key parts.
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
	Name              string
	IgnoreLimits      bool
	AllowUnconfigured bool
}

// Tree is the immutable, matched-against descriptor tree of every RLS domain.
// Safe for concurrent use.
type Tree struct{}

// Domain returns the configuration of the RLS domain name.
func (t *Tree) Domain(name string) (*DomainConfig, bool) { return nil, false }

// Match matches one request descriptor of the RLS domain. ok is false when it
// matches no leaf with a limit.
func (t *Tree) Match(domain string, entries []Entry) (m Match, ok bool) { return Match{}, false }

// ApplyReplaces marks the matches whose limit is named in another match's
// Replaces.
func ApplyReplaces(ms []Match) {}
