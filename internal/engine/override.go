package engine

import (
	"sync"
	"time"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/tiers"
)

// overrideCache shares one policy and limit per distinct override, so that a
// request carrying an override allocates only its resource name. Bounded.
type overrideCache struct {
	mu sync.RWMutex
	m  map[overrideKey]*descriptors.Limit
}

type overrideKey struct {
	Override
	fixed, overdraft bool
}

// limit is o's limit: a one-tier sliding window, or with fixed (and one
// unit) envoyproxy/ratelimit's fixed window of o.Unit; post-paid with
// overdraft.
func (c *overrideCache) limit(o Override, fixed, overdraft bool) *descriptors.Limit {
	if o.Multiplier == 0 {
		o.Multiplier = 1
	}
	// A limit of 0 is a fixed window of 0 in either mode: it rejects
	// everything and answers with the rest of its unit as the reset.
	fixed = fixed && o.Multiplier == 1 || o.RequestsPerUnit == 0
	k := overrideKey{o, fixed, overdraft}
	c.mu.RLock()
	l, ok := c.m[k]
	c.mu.RUnlock()
	if ok {
		return l
	}
	p := &tiers.Policy{Kind: tiers.KindTiers}
	if fixed {
		p = &tiers.Policy{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Limit: int64(o.RequestsPerUnit), Unit: o.Unit}}
	} else if o.RequestsPerUnit > 0 {
		p.Tiers = []tiers.Tier{{
			Limit:  int64(o.RequestsPerUnit),
			Window: o.Unit.Length() * time.Duration(o.Multiplier),
			Active: tiers.Unbounded,
		}}
	}
	p.Overdraft = overdraft
	l = &descriptors.Limit{Policy: p, ID: descriptors.PolicyID(p, nil, nil), Shape: p.Shape()}
	c.mu.Lock()
	if c.m == nil {
		c.m = make(map[overrideKey]*descriptors.Limit)
	}
	if len(c.m) < maxCached {
		c.m[k] = l
	}
	c.mu.Unlock()
	return l
}

// overrideMatch turns m, the descriptor's configured match (ok: it has
// one), into the match of descriptor d's own limit: a one-tier sliding
// window whose resource is the RLS domain and the descriptor's entries, all
// in one Charon domain. m keeps its MetricKey. With fixed-window overrides,
// the limit is a fixed window, and when the configured limit is a fixed
// window of the same unit the override counts in its state, as
// envoyproxy/ratelimit's counter is the same for both.
func (e *Engine) overrideMatch(buf []byte, domain string, d *Descriptor, m *descriptors.Match, ok bool) []byte {
	l := e.override.limit(*d.Override, e.fixedOverrides, e.overdraft)
	if ok && l.Policy.Kind == tiers.KindFixedWindow && m.Policy != nil && m.Policy.Kind == tiers.KindFixedWindow && m.Policy.Overdraft == l.Policy.Overdraft &&
		m.Policy.Window.Unit == l.Policy.Window.Unit && m.Limit != nil {
		shared := *l
		shared.ID = m.Limit.ID
		m.Limit, m.Policy, m.Shape, m.Replaced = &shared, l.Policy, l.Shape, false
		return buf
	}
	buf = append(buf, descriptors.Escape(domain)...)
	buf = append(buf, "/~limit"...)
	for _, en := range d.Entries {
		buf = append(buf, '/')
		buf = append(buf, descriptors.Escape(en.Key)...)
		buf = append(buf, '=')
		buf = append(buf, descriptors.Escape(en.Value)...)
	}
	m.Limit, m.Policy, m.Shape, m.Domain, m.Replaced = l, l.Policy, l.Shape, "", false
	m.Resource = descriptors.Bound(string(buf))
	return buf
}
