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
	zone             string // the calendar units' zone, "" for none
}

// limit is o's limit: a one-tier sliding window, or with fixed (and one
// unit) envoyproxy/ratelimit's fixed window of o.Unit; post-paid with
// overdraft. With cal (calendar units), a limit of one day, week, month or
// year counts per calendar period of cal's clock, in either mode.
func (c *overrideCache) limit(o Override, cal *time.Location, fixed, overdraft bool) *descriptors.Limit {
	if o.Multiplier == 0 {
		o.Multiplier = 1
	}
	per, calendar := o.Unit.CalendarPeriod()
	calendar = calendar && cal != nil && o.Multiplier == 1 && o.RequestsPerUnit > 0
	// A limit of 0 is a fixed window of 0 in either mode: it rejects
	// everything and answers with the rest of its unit as the reset.
	fixed = !calendar && (fixed && o.Multiplier == 1 || o.RequestsPerUnit == 0)
	k := overrideKey{Override: o, fixed: fixed, overdraft: overdraft}
	if calendar {
		k.zone = cal.String()
	}
	c.mu.RLock()
	l, ok := c.m[k]
	c.mu.RUnlock()
	if ok {
		return l
	}
	p := &tiers.Policy{Kind: tiers.KindTiers}
	if calendar {
		p = &tiers.Policy{Kind: tiers.KindQuota, Quota: tiers.Quota{Limit: int64(o.RequestsPerUnit), Period: per, Location: cal}}
	} else if fixed {
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

// sameCounter reports whether a request's own limit p counts in the state
// of the configured limit c, as envoyproxy/ratelimit's counter of a unit
// is one whatever the limit: fixed windows of one unit, calendar periods
// of one unit and zone.
func sameCounter(c, p *tiers.Policy) bool {
	switch {
	case p.Kind == tiers.KindFixedWindow && c.Kind == tiers.KindFixedWindow:
		return c.Window.Unit == p.Window.Unit
	case p.Kind == tiers.KindQuota && c.Kind == tiers.KindQuota:
		return c.Shape() == p.Shape()
	}
	return false
}

// overrideMatch turns m, the descriptor's configured match (ok: it has
// one), into the match of descriptor d's own limit: a one-tier sliding
// window whose resource is the RLS domain and the descriptor's entries, all
// in one Charon domain. m keeps its MetricKey. With fixed-window overrides,
// the limit is a fixed window, and when the configured limit is a fixed
// window of the same unit the override counts in its state, as
// envoyproxy/ratelimit's counter is the same for both; so for a calendar
// period (cal: the domain's calendar units) and a configured limit of that
// period.
func (e *Engine) overrideMatch(buf []byte, domain string, cal *time.Location, d *Descriptor, m *descriptors.Match, ok bool) []byte {
	l := e.override.limit(*d.Override, cal, e.fixedOverrides, e.overdraft)
	if ok && m.Policy != nil && m.Limit != nil && m.Policy.Overdraft == l.Policy.Overdraft && sameCounter(m.Policy, l.Policy) {
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
