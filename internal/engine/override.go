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
	m  map[Override]*descriptors.Limit
}

func (c *overrideCache) limit(o Override) *descriptors.Limit {
	if o.Multiplier == 0 {
		o.Multiplier = 1
	}
	c.mu.RLock()
	l, ok := c.m[o]
	c.mu.RUnlock()
	if ok {
		return l
	}
	p := &tiers.Policy{Kind: tiers.KindTiers}
	if o.RequestsPerUnit > 0 {
		p.Tiers = []tiers.Tier{{
			Limit:  int64(o.RequestsPerUnit),
			Window: o.Unit.Length() * time.Duration(o.Multiplier),
			Active: tiers.Unbounded,
		}}
	}
	l = &descriptors.Limit{Policy: p, ID: descriptors.PolicyID(p, nil, nil)}
	c.mu.Lock()
	if c.m == nil {
		c.m = make(map[Override]*descriptors.Limit)
	}
	if len(c.m) < maxCached {
		c.m[o] = l
	}
	c.mu.Unlock()
	return l
}

// overrideMatch turns m into the match of descriptor d's own limit: a
// one-tier sliding window whose resource is the RLS domain and the
// descriptor's entries, all in one Charon domain. m keeps its MetricKey.
func (e *Engine) overrideMatch(buf []byte, domain string, d *Descriptor, m *descriptors.Match) []byte {
	l := e.override.limit(*d.Override)
	buf = append(buf, descriptors.Escape(domain)...)
	buf = append(buf, "/~limit"...)
	for _, en := range d.Entries {
		buf = append(buf, '/')
		buf = append(buf, descriptors.Escape(en.Key)...)
		buf = append(buf, '=')
		buf = append(buf, descriptors.Escape(en.Value)...)
	}
	m.Limit, m.Policy, m.Domain, m.Replaced = l, l.Policy, "", false
	m.Resource = descriptors.Bound(string(buf))
	return buf
}
