package engine

import (
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/tiers"
)

// unitOf expresses w as multiplier × the largest of second, minute, hour and
// day that divides it. exact is false when no unit divides w (then the unit
// is a second and the multiplier 0).
func unitOf(w time.Duration) (u tiers.Unit, mult uint32, exact bool) {
	for _, u := range [...]tiers.Unit{tiers.UnitDay, tiers.UnitHour, tiers.UnitMinute, tiers.UnitSecond} {
		l := u.Length()
		if w > 0 && w%l == 0 {
			m := min(w/l, math.MaxUint32)
			if m == 1 {
				m = 0
			}
			return u, uint32(m), true
		}
	}
	return tiers.UnitSecond, 0, false
}

// currentLimit is the limit reported with decision d of match m: the current
// tier's (tier 1's when none is active yet). o is the descriptor's own limit,
// when m is its match.
func (e *Engine) currentLimit(m *descriptors.Match, d *tiers.Decision, o *Override) CurrentLimit {
	p := m.Policy
	if o != nil && o.RequestsPerUnit == 0 {
		// envoyproxy/ratelimit reports the limit as asked: 0 per its unit,
		// with no name.
		cl := CurrentLimit{Unit: o.Unit}
		if o.Multiplier > 1 {
			cl.Multiplier = o.Multiplier
		}
		return cl
	}
	switch p.Kind {
	case tiers.KindFixedWindow:
		return CurrentLimit{RequestsPerUnit: clamp32(p.Window.Limit), Unit: p.Window.Unit, Name: m.Limit.Name}
	case tiers.KindQuota:
		// A rate limit in calendar units: its unit, as configured.
		cl := quotaLimit(&p.Quota)
		cl.Name = m.Limit.Name
		return cl
	}
	limit, window, tier := d.TierLimit, d.TierWindow, d.Tier
	if p.Kind == tiers.KindTiers && tier == 0 && len(p.Tiers) > 0 {
		limit, window, tier = p.Tiers[0].Limit, p.Tiers[0].Window, 1
	}
	u, mult, exact := unitOf(window)
	cl := CurrentLimit{RequestsPerUnit: clamp32(limit), Unit: u, Multiplier: mult, Name: m.Limit.Name}
	if p.Concurrency {
		// Its limit per its ttl, as Envoy's headers can say it, named for
		// what it is.
		if cl.Name == "" {
			cl.Name = e.names.name(limit, window, inFlight)
		}
		return cl
	}
	multiTier := p.Kind == tiers.KindTiers && len(p.Tiers) > 1
	if multiTier || !exact || mult > 1 {
		if !multiTier {
			tier = 0
		}
		cl.Name = e.names.name(limit, window, tier)
	}
	return cl
}

// quotaLimit is the limit reported for a calendar quota: its limit per
// period (a quarter is 3 months), named so that a reader of the headers
// or of the access log knows it is a quota.
func quotaLimit(q *tiers.Quota) CurrentLimit {
	cl := CurrentLimit{RequestsPerUnit: clamp32(q.Limit), Name: "quota: " + strconv.FormatInt(q.Limit, 10) + " per " + q.Period.String()}
	switch q.Period {
	case tiers.PeriodMinute:
		cl.Unit = tiers.UnitMinute
	case tiers.PeriodHour:
		cl.Unit = tiers.UnitHour
	case tiers.PeriodDay:
		cl.Unit = tiers.UnitDay
	case tiers.PeriodWeek:
		cl.Unit = tiers.UnitWeek
	case tiers.PeriodMonth:
		cl.Unit = tiers.UnitMonth
	case tiers.PeriodQuarter:
		cl.Unit, cl.Multiplier = tiers.UnitMonth, 3
	case tiers.PeriodYear:
		cl.Unit = tiers.UnitYear
	}
	return cl
}

// fixedAnswer makes st, the status of a fixed window of unit u decided at
// now, envoyproxy/ratelimit's: limit_remaining 0 when the window rejected
// (shadow and quota descriptors included), and duration_until_reset in whole
// seconds, as its windows and resets are counted (Envoy's X-RateLimit-Reset
// truncates the duration, so 19.7 s would read 19, and 0 in a window's last
// second). A reset that never comes stays so unless the Engine answers as
// envoyproxy/ratelimit (Options.FixedWindowOverrides, --fixed-window), whose
// reset is always the rest of the window, or the window is a limit of 0
// (requests_per_unit: 0 in either algorithm), which envoyproxy/ratelimit
// answers so in every mode: a client is told when to ask again, not 292
// years.
func (e *Engine) fixedAnswer(st *Status, w tiers.FixedWindow, now time.Time) {
	u := w.Unit
	if !st.Decision.OK {
		st.Remaining = 0
	}
	switch {
	case st.ResetAfter != tiers.Unbounded:
		// The window ends on a whole second: rounding up is its end.
		if r := st.ResetAfter % time.Second; r != 0 {
			st.ResetAfter += time.Second - r
		}
	case e.fixedOverrides, w.Limit == 0:
		st.ResetAfter = windowRest(u, now)
	}
}

// windowRest is envoyproxy/ratelimit's reset of a window of unit u at now
// (its CalculateReset): the unit's length in seconds less the whole Unix
// seconds since the window began, from 1 s to the unit's length; the
// windows are tiers' fixed windows.
func windowRest(u tiers.Unit, now time.Time) time.Duration {
	n := int64(u.Length() / time.Second)
	if n <= 0 {
		return 0
	}
	r := now.Unix() % n
	if r < 0 {
		r += n
	}
	return time.Duration(n-r) * time.Second
}

func clamp32(v int64) uint32 { return uint32(min(max(v, 0), math.MaxUint32)) }

// nameCache memoizes limit descriptions ("5 per 2s, tier 1"); it is bounded
// and emptied when the tree changes.
type nameCache struct {
	mu sync.RWMutex
	m  map[nameKey]string
}

type nameKey struct {
	limit  int64
	window time.Duration
	tier   int
}

const maxCached = 4096

func (c *nameCache) name(limit int64, window time.Duration, tier int) string {
	k := nameKey{limit, window, tier}
	c.mu.RLock()
	s, ok := c.m[k]
	c.mu.RUnlock()
	if ok {
		return s
	}
	s = describe(limit, window, tier)
	c.mu.Lock()
	if c.m == nil {
		c.m = make(map[nameKey]string)
	}
	if len(c.m) < maxCached {
		c.m[k] = s
	}
	c.mu.Unlock()
	return s
}

func (c *nameCache) reset() {
	c.mu.Lock()
	c.m = nil
	c.mu.Unlock()
}

// inFlight is the tier of nameCache.name that describes a concurrency
// limit.
const inFlight = -1

// describe writes "5 per 2s", with ", tier N" when tier > 0; for tier
// inFlight, "5 in flight, ttl 2s".
func describe(limit int64, window time.Duration, tier int) string {
	b := strconv.AppendInt(make([]byte, 0, 32), limit, 10)
	if tier == inFlight {
		return string(appendWindow(append(b, " in flight, ttl "...), window))
	}
	b = append(b, " per "...)
	b = appendWindow(b, window)
	if tier > 0 {
		b = append(b, ", tier "...)
		b = strconv.AppendInt(b, int64(tier), 10)
	}
	return string(b)
}

func appendWindow(b []byte, w time.Duration) []byte {
	for _, u := range [...]struct {
		l time.Duration
		s string
	}{{tiers.UnitDay.Length(), "d"}, {time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}} {
		if w > 0 && w%u.l == 0 {
			return append(strconv.AppendInt(b, int64(w/u.l), 10), u.s...)
		}
	}
	return append(b, w.String()...)
}
