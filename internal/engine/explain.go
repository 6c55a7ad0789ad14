package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/tiers"
)

// Why a descriptor is not rate limited (Explanation.Reason).
const (
	ReasonUnknownDomain = "unknown domain"
	ReasonNoMatch       = "no descriptor of the domain matches"
	ReasonUnlimited     = "unlimited"
	ReasonReplaced      = "replaced by another descriptor of the request"
	ReasonCopies        = "a copy-limited resource: Reserve holds its copies"
)

// Which limit is in force when it is not the leaf's own (Explanation.Override).
const (
	OverrideDomain  = "domain"  // the leaf's override for this Charon domain
	OverrideRequest = "request" // the descriptor's own limit (RateLimitOverride)
)

// Explanation is what Explain finds for one descriptor: how the request
// resolves, the limit in force, and the pair's state, as ShouldRateLimit
// would meet them.
type Explanation struct {
	// Match is the descriptor's match: the leaf (Limit, with its File and
	// Line), the resource, the Charon domain and the effective policy.
	Match descriptors.Match
	// Limited reports that a rate limit applies; when not, Reason says why.
	Limited bool
	Reason  string
	// Override is OverrideDomain or OverrideRequest when the policy in force
	// is not the leaf's default, else empty.
	Override string
	// Shadow and Quota report shadow mode (or the domain's ignore_limits)
	// and quota mode: a rejection would be answered OK, or only fail the
	// request when every quota descriptor is over.
	Shadow, Quota bool
	// View is the pair's state now, as tiers.Inspect computes it, and
	// Summary says it in words.
	View    tiers.View
	Summary string
	// Quota, when the descriptor has a calendar quota, is the quota's
	// state: its view, in words, and the end of its current period.
	CalendarQuota *QuotaExplanation
	// Escrow, when the pair is decided from escrow leases on this process
	// (a store.Holder), is what they hold.
	Escrow *store.Holding
}

// QuotaExplanation is the state of a descriptor's calendar quota.
type QuotaExplanation struct {
	Policy    *tiers.Policy
	View      tiers.View
	Summary   string
	PeriodEnd time.Time
}

// Explain resolves req exactly as ShouldRateLimit would and reads, without
// changing anything, the state of each limited descriptor's pair. It needs a
// store that is a store.Inspector (the memory and Redis stores are); a store
// failure matches ErrStore. Bad input yields a *descriptors.InputError as for
// ShouldRateLimit.
func (e *Engine) Explain(ctx context.Context, req *Request) ([]Explanation, error) {
	e.once.Do(e.defaults)
	if err := e.validate(req); err != nil {
		return nil, err
	}
	now := e.now()
	tree := e.tree.Load()
	dc, known := tree.Domain(req.Domain)
	sc := e.scratch.Get().(*scratch)
	defer e.putScratch(sc)
	e.match(tree, req, known, sc)
	out := make([]Explanation, len(req.Descriptors))
	for i := range out {
		x := &out[i]
		x.Match = sc.matches[i]
		it, ok := e.explainItem(req, i, x, known)
		qit, qok := quotaItem(req, i, x)
		if !ok && !qok {
			continue
		}
		mode := e.mode(x.Match.Limit, x.Override == OverrideRequest, dc.IgnoreLimits)
		x.Shadow, x.Quota = mode.shadow, mode.quota
		in, isIn := e.store.(store.Inspector)
		if !isIn {
			return nil, fmt.Errorf("%w: %w", ErrStore, store.ErrCannotInspect)
		}
		if ok {
			v, err := in.Inspect(ctx, now, &it)
			if err != nil {
				return nil, fmt.Errorf("%w: %w", ErrStore, err)
			}
			x.View, x.Summary = v, v.Summary(x.Match.Policy)
			if ho, isHo := e.store.(store.Holder); isHo {
				if h, held := ho.Holding(&it, now); held {
					x.Escrow = &h
				}
			}
		}
		if qok {
			v, err := in.Inspect(ctx, now, &qit)
			if err != nil {
				return nil, fmt.Errorf("%w: %w", ErrStore, err)
			}
			_, end := qit.Policy.Quota.Bounds(now)
			x.CalendarQuota = &QuotaExplanation{Policy: qit.Policy, View: v, Summary: v.Summary(qit.Policy), PeriodEnd: end}
		}
	}
	return out, nil
}

// Reset forgets the state of every limited descriptor's pair of req (not
// their resources' global state) and returns how many pairs it reset.
func (e *Engine) Reset(ctx context.Context, req *Request) (int, error) {
	e.once.Do(e.defaults)
	if err := e.validate(req); err != nil {
		return 0, err
	}
	tree := e.tree.Load()
	_, known := tree.Domain(req.Domain)
	sc := e.scratch.Get().(*scratch)
	defer e.putScratch(sc)
	e.match(tree, req, known, sc)
	n := 0
	for i := range req.Descriptors {
		x := Explanation{Match: sc.matches[i]}
		it, ok := e.explainItem(req, i, &x, known)
		qit, qok := quotaItem(req, i, &x)
		for _, pair := range []struct {
			it *store.Item
			ok bool
		}{{&it, ok}, {&qit, qok}} {
			if !pair.ok {
				continue
			}
			in, isIn := e.store.(store.Inspector)
			if !isIn {
				return n, fmt.Errorf("%w: %w", ErrStore, store.ErrCannotInspect)
			}
			if err := in.Reset(ctx, pair.it); err != nil {
				return n, fmt.Errorf("%w: %w", ErrStore, err)
			}
			n++
		}
	}
	return n, nil
}

// quotaItem returns the store item of descriptor i's calendar quota, when
// it has one that applies (explainItem found it limited).
func quotaItem(req *Request, i int, x *Explanation) (store.Item, bool) {
	m := &x.Match
	if !x.Limited || m.Limit == nil || m.Limit.Quota == nil {
		return store.Item{}, false
	}
	hits := int64(hitsOf(req, &req.Descriptors[i]))
	return store.Item{
		Key:    store.Key{Resource: m.Resource, Domain: m.Domain, PolicyID: m.Limit.QuotaID},
		Policy: m.Limit.Quota, Hits: hits, Min: hits,
	}, true
}

// explainItem fills x's Limited, Reason and Override for descriptor i, and
// returns the store item of its pair when it is limited.
func (e *Engine) explainItem(req *Request, i int, x *Explanation, known bool) (store.Item, bool) {
	m, d := &x.Match, &req.Descriptors[i]
	switch l := m.Limit; {
	case !known:
		x.Reason = ReasonUnknownDomain
	case l == nil:
		x.Reason = ReasonNoMatch
	case l.Unlimited:
		// Before replaced: replaces never drop an unlimited limit.
		x.Reason = ReasonUnlimited
	case m.Replaced:
		x.Reason = ReasonReplaced
	case l.Copies != nil:
		x.Reason = ReasonCopies
	case m.Policy == nil && l.Quota != nil:
		x.Limited = true
	case m.Policy == nil:
		x.Reason = ReasonNoMatch
	default:
		x.Limited = true
		switch {
		case d.Override != nil:
			x.Override = OverrideRequest
		case l.Overrides[m.Domain] != nil && l.Overrides[m.Domain] == m.Policy:
			x.Override = OverrideDomain
		}
		hits := int64(hitsOf(req, d))
		return store.Item{
			Key:    store.Key{Resource: m.Resource, Domain: m.Domain, PolicyID: m.Shape},
			Policy: m.Policy, Hits: hits, Min: hits,
		}, true
	}
	return store.Item{}, false
}
