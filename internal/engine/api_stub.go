package engine

import (
	"context"
	"time"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/tiers"
)

// This file fixes the package's surface while it is being written; its
// declarations move to their own files.

// Override is a request descriptor's own limit (Envoy's RateLimitOverride).
type Override struct {
	RequestsPerUnit uint32
	Unit            tiers.Unit
	Multiplier      uint32 // 0 or 1: one unit
}

// Descriptor is one descriptor of a request.
type Descriptor struct {
	Entries []descriptors.Entry
	// Hits, when HasHits, overrides the request's hits for this descriptor.
	Hits    uint64
	HasHits bool
	// Refund gives Hits back instead of taking them (is_negative_hits).
	Refund   bool
	Override *Override
}

// Request is one ShouldRateLimit call.
type Request struct {
	Domain      string
	Descriptors []Descriptor
	Hits        uint32 // 0 means 1
}

// Code is a descriptor's or a request's answer.
type Code uint8

const (
	CodeOK Code = iota + 1
	CodeOverLimit
)

// CurrentLimit is the limit reported to Envoy.
type CurrentLimit struct {
	RequestsPerUnit uint32
	Unit            tiers.Unit
	Multiplier      uint32 // 0 or 1: one unit
	Name            string
}

// Status is the answer for one descriptor.
type Status struct {
	Code       Code
	Limit      *CurrentLimit // nil: not limited
	Remaining  uint32
	ResetAfter time.Duration
	// Shadow is set when the limit would have rejected but shadow mode or
	// ignore_limits answered OK.
	Shadow   bool
	Decision tiers.Decision
	Match    descriptors.Match
}

// Response is the answer to a Request, statuses in request order.
type Response struct {
	Code     Code
	Statuses []Status
}

// Engine decides requests. Safe for concurrent use.
type Engine struct{}

// SetTree swaps in a new descriptor tree atomically.
func (e *Engine) SetTree(t *descriptors.Tree) {}

// ShouldRateLimit decides req. Bad input yields an *InputError naming the field
// before any state is touched.
func (e *Engine) ShouldRateLimit(ctx context.Context, req *Request) (*Response, error) {
	return nil, nil
}

// InputError is a request that cannot be decided; Field names the culprit,
// e.g. "descriptors[2].entries[0].key".
type InputError struct {
	Field, Message string
}

func (e *InputError) Error() string { return e.Field + ": " + e.Message }
