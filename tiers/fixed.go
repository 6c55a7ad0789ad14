package tiers

import (
	"strconv"
	"strings"
	"time"
)

// units are the fixed-window units by their value: envoyproxy/ratelimit's
// names, and their lengths in seconds as its UnitToDivider defines them (a
// month is 30 days, a year 365 days).
var units = [...]struct {
	name    string
	seconds int64
}{
	UnitSecond: {"second", 1},
	UnitMinute: {"minute", 60},
	UnitHour:   {"hour", 60 * 60},
	UnitDay:    {"day", 24 * 60 * 60},
	UnitWeek:   {"week", 7 * 24 * 60 * 60},
	UnitMonth:  {"month", 30 * 24 * 60 * 60},
	UnitYear:   {"year", 365 * 24 * 60 * 60},
}

// unitMicros returns the length of u in µs, or 0 for an unknown unit.
func unitMicros(u Unit) int64 {
	if u == 0 || int(u) >= len(units) {
		return 0
	}
	return units[u].seconds * second
}

// Length returns the length of u as envoyproxy/ratelimit counts it (a month
// is 30 days, a year 365 days), or 0 for an unknown unit: the length of a
// fixed window of u, and the window of the sliding-window tier that a
// rate_limit of one u resolves to.
func (u Unit) Length() time.Duration {
	return time.Duration(unitMicros(u)) * time.Microsecond
}

// String returns the unit's name in an envoyproxy/ratelimit config
// ("second", "minute", "hour", "day", "week", "month", "year"), or
// "Unit(n)" for an unknown unit.
func (u Unit) String() string {
	if unitMicros(u) == 0 {
		return "Unit(" + strconv.Itoa(int(u)) + ")"
	}
	return units[u].name
}

// ParseUnit returns the unit named s, in any case, as String spells it; ok
// is false for any other name.
func ParseUnit(s string) (u Unit, ok bool) {
	for i := range units {
		if i > 0 && strings.EqualFold(s, units[i].name) {
			return Unit(i), true
		}
	}
	return 0, false
}

// window returns the start of the fixed window holding t, in µs, and its
// length: the Unix time in seconds truncated to a multiple of the unit's
// length, like envoyproxy/ratelimit's cache keys. A state whose window is not
// older than t's is counted in its own window (time that goes backwards
// counts against the newer window).
//
// A calendar quota (KindQuota) is counted the same way over its periods
// (Quota.Bounds); length is then the length of the period returned.
//
// The hits reserved in the window after the state's (s.ahead, reserve.go)
// are that window's count once it holds t.
func fixedWindow(p *Policy, s *State, t int64) (start, length, count int64) {
	if p.Kind == KindQuota {
		var end int64
		start, end = p.Quota.bounds(t)
		if s.used && s.at >= start {
			if s.at != start {
				start, end = p.Quota.bounds(s.at)
			}
			return s.at, end - start, s.val
		}
		if s.used && s.ahead > 0 {
			if _, e := p.Quota.bounds(s.at); e == start {
				return start, end - start, s.ahead
			}
		}
		return start, end - start, 0
	}
	length = unitMicros(p.Window.Unit)
	start = floorDiv(t, length) * length
	if s.used && s.at >= start {
		return s.at, length, s.val
	}
	if s.used && s.ahead > 0 && s.at+length == start {
		return start, length, s.ahead
	}
	return start, length, 0
}

// setWindow sets s to count cnt in the window starting at start (the
// window fixedWindow returned): the hits reserved ahead of the state's
// window are in cnt once start is past it.
func setWindow(s *State, start, cnt int64) {
	if s.at != start {
		s.ahead = 0
	}
	s.used, s.at, s.val = true, start, cnt
}

// windowLimit returns the limit of a fixed window or quota policy, and
// whether its unit or period is known.
func windowLimit(p *Policy) (int64, bool) {
	if p.Kind == KindQuota {
		return p.Quota.Limit, p.Quota.Period != 0 && int(p.Quota.Period) < len(periodNames)
	}
	return p.Window.Limit, unitMicros(p.Window.Unit) != 0
}

func decideFixed(p *Policy, s *State, t, k, m int64, commit bool) Decision {
	lim, known := windowLimit(p)
	if !known || lim < 1 {
		return closed()
	}
	start, length, cnt := fixedWindow(p, s, t)
	d := Decision{Tier: 1}
	reset := FromMicros(start + length - t)
	n := min(k, max(0, lim-cnt))
	if n >= m && m <= k && !(p.Overdraft && cnt > lim) {
		d.OK, d.Granted = true, n
		d.TierHits = cnt + n
		d.Remaining = max(0, lim-cnt-n)
		d.ResetAfter = reset
		if commit && n > 0 {
			setWindow(s, start, cnt+n)
		}
		return d
	}
	d.TierHits = cnt
	d.Remaining = max(0, lim-cnt)
	if p.Overdraft {
		// Post-paid: the k hits are counted all the same.
		d.Remaining = 0
		if commit && k > 0 {
			setWindow(s, start, min(cnt+k, maxCount))
		}
	}
	if need := needed(k, m); need > k || need > lim {
		d.RetryAfter = Unbounded
	} else {
		d.RetryAfter = reset
	}
	d.ResetAfter = d.RetryAfter
	return d
}

func refundFixed(p *Policy, s *State, t, hits int64) {
	if _, known := windowLimit(p); !known || hits <= 0 {
		return
	}
	start, _, cnt := fixedWindow(p, s, t)
	if cnt <= 0 {
		return
	}
	setWindow(s, start, max(0, cnt-hits))
}

func forgetFixed(p *Policy, s *State) (int64, bool) {
	if _, known := windowLimit(p); !known || !s.used || (s.val <= 0 && s.ahead <= 0) {
		return 0, false
	}
	end := s.at + unitMicros(p.Window.Unit)
	if p.Kind == KindQuota {
		_, end = p.Quota.bounds(s.at)
	}
	if s.ahead > 0 {
		// Kept until the window reserved in ends.
		end, _ = nextWindow(p, end)
	}
	return end, true
}

// nextWindow returns the end of the window (period) starting at start,
// and its length.
func nextWindow(p *Policy, start int64) (end, length int64) {
	if p.Kind == KindQuota {
		s, e := p.Quota.bounds(start)
		return e, e - s
	}
	length = unitMicros(p.Window.Unit)
	return start + length, length
}
