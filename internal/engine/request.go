package engine

import (
	"context"
	"errors"
	"fmt"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/tiers"
)

// ErrCopyLimited is wrapped, in a *descriptors.FieldError of field
// "resource", by the error of a rate operation (Request) on a copy-limited
// resource; the server maps it to its own gRPC code.
var ErrCopyLimited = errors.New("engine: resource is copy-limited, use Reserve")

// Result is the answer to a bulk Request.
type Result struct {
	// Decision is the store's decision with its full context (SPEC §2). For
	// an unlimited or unconfigured resource it is a plain grant of every
	// copy with no context.
	Decision tiers.Decision
	// Match is the descriptor's match; its Resource is empty for an
	// unconfigured resource.
	Match descriptors.Match
	// Unlimited reports that no limit applies: an unlimited leaf, or a
	// resource matching nothing in a domain with allow_unconfigured.
	Unlimited bool
	// Shadow reports a rejection turned into a grant by shadow_mode or the
	// domain's ignore_limits; nothing was committed.
	Shadow bool
}

// Request is the bulk form of ShouldRateLimit for one rate-limited resource:
// it grants the largest n in [min, copies] the policy allows (min 0 accepts
// none), or nothing, through the same store and clock. A copy-limited
// resource is ErrCopyLimited; a resource matching no limit is
// descriptors.ErrUnknownResource unless the RLS domain has
// allow_unconfigured (then every copy is granted). Bad input is a
// *descriptors.InputError; a store failure matches ErrStore.
func (e *Engine) Request(ctx context.Context, domain string, entries []descriptors.Entry, copies, min int64) (Result, error) {
	e.once.Do(e.defaults)
	if err := descriptors.ValidateResource(domain, entries); err != nil {
		return Result{}, err
	}
	switch {
	case copies < 1:
		return Result{}, &descriptors.InputError{Field: "copies", Message: fmt.Sprintf("%d, want at least 1", copies)}
	case uint64(copies) > e.maxHits:
		return Result{}, &descriptors.InputError{Field: "copies", Message: fmt.Sprintf("%d, more than %d", copies, e.maxHits)}
	case min < 0 || min > copies:
		return Result{}, &descriptors.InputError{Field: "min_copies", Message: fmt.Sprintf("%d, want in [0, copies %d]", min, copies)}
	}
	tree := e.tree.Load()
	dc, known := tree.Domain(domain)
	m, ok := tree.Match(domain, entries)
	if !ok {
		if known && dc.AllowUnconfigured {
			return Result{Decision: grantAll(copies), Unlimited: true}, nil
		}
		return Result{}, &descriptors.FieldError{Field: "resource", Err: fmt.Errorf("%w: no limit matches domain %q and its entries", descriptors.ErrUnknownResource, descriptors.Truncate(domain))}
	}
	l := m.Limit
	switch {
	case l.Copies != nil:
		return Result{Match: m}, &descriptors.FieldError{Field: "resource", Err: fmt.Errorf("%w: %s", ErrCopyLimited, m.Resource)}
	case l.Unlimited:
		return Result{Decision: grantAll(copies), Match: m, Unlimited: true}, nil
	case m.Policy == nil && l.Quota == nil:
		// A limit of zero (a Policy-less leaf built by hand): never granted.
		return Result{Decision: tiers.Decision{OK: min == 0, RetryAfter: tiers.Unbounded, ResetAfter: tiers.Unbounded}, Match: m}, nil
	}
	shadow := (known && dc.IgnoreLimits) || l.ShadowMode
	// The rate policy and the calendar quota are an item each, decided all
	// or nothing together. Two limits may grant different numbers of a
	// request's copies, so with both a request is granted whole or not at
	// all (its min_copies is its copies).
	need := max(min, 1)
	if m.Policy != nil && l.Quota != nil {
		need = copies
	}
	var items [2]store.Item
	n := 0
	if l.Quota != nil {
		items[n] = store.Item{Key: store.Key{Resource: m.Resource, Domain: m.Domain, PolicyID: l.QuotaID}, Policy: l.Quota,
			Hits: copies, Min: need, Shadow: shadow}
		n++
	}
	if m.Policy != nil {
		items[n] = store.Item{Key: store.Key{Resource: m.Resource, Domain: m.Domain, PolicyID: m.Shape}, Policy: m.Policy,
			Hits: copies, Min: need, Shadow: shadow}
		n++
	}
	var out [2]tiers.Decision
	if err := e.decide(ctx, e.now(), items[:n], out[:n]); err != nil {
		return Result{Match: m}, err
	}
	// The answer is the rate policy's (the quota's alone without one), or
	// the quota's when it refused; what remains is the smaller.
	d := out[n-1]
	if n == 2 {
		if !out[0].OK {
			d = out[0]
		} else if d.OK && out[0].Remaining < d.Remaining {
			d.Remaining = out[0].Remaining
		}
	}
	r := Result{Decision: d, Match: m}
	if !r.Decision.OK {
		switch {
		case shadow:
			r.Shadow = true
			r.Decision.OK, r.Decision.Granted = true, copies
		case min == 0:
			// Zero granted is a grant of "any number, none included".
			r.Decision.OK = true
		}
	}
	return r, nil
}

// grantAll is the answer where no limit applies: everything granted, and
// Remaining as large as a request may ask.
func grantAll(copies int64) tiers.Decision {
	return tiers.Decision{OK: true, Granted: copies, Remaining: 1 << 50}
}
