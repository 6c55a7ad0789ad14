package tiers

import "time"

// This file fixes the package's surface while it is being written; its
// declarations move to their own files.

// State is the state of one (resource, domain) pair. The zero value is a pair
// with no history. A State is not safe for concurrent use.
type State struct{}

// Global is the per-resource state shared by all its domains (the hits of the
// last second, for the global limit). The zero value has no history. Not safe
// for concurrent use.
type Global struct{}

// Request decides a request of copies hits of which at least min must be
// granted, at now, and commits the grant into s and g (g may be nil when the
// policy has no global limit). A rejection changes nothing.
func Request(p *Policy, s *State, g *Global, now time.Time, copies, min int64) Decision {
	return Decision{}
}

// Peek answers exactly what Request would, changing nothing.
func Peek(p *Policy, s *State, g *Global, now time.Time, copies, min int64) Decision {
	return Decision{}
}

// Refund gives back up to hits previously granted hits (Envoy's
// is_negative_hits).
func Refund(p *Policy, s *State, g *Global, now time.Time, hits int64) {}

// ForgetAt returns the instant from which forgetting s cannot change any
// decision under p.
func ForgetAt(p *Policy, s *State) time.Time { return time.Time{} }

// ForgetAt returns the instant from which forgetting g cannot change any
// decision.
func (g *Global) ForgetAt() time.Time { return time.Time{} }

// Normalize returns p normalized as the paper §4.1 describes, with one
// human-readable note per change.
func Normalize(p Policy) (Policy, []string) { return p, nil }

// Validate reports the first invalid field of p, naming it.
func Validate(p *Policy) error { return nil }
