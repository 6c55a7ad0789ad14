package tiers

// unitSeconds returns the length of a fixed-window unit in seconds, as
// envoyproxy/ratelimit's UnitToDivider defines it (a month is 30 days, a
// year 365 days), or 0 for an unknown unit.
func unitSeconds(u Unit) int64 {
	switch u {
	case UnitSecond:
		return 1
	case UnitMinute:
		return 60
	case UnitHour:
		return 60 * 60
	case UnitDay:
		return 60 * 60 * 24
	case UnitWeek:
		return 60 * 60 * 24 * 7
	case UnitMonth:
		return 60 * 60 * 24 * 30
	case UnitYear:
		return 60 * 60 * 24 * 365
	}
	return 0
}

// window returns the start of the fixed window holding t, in µs, and its
// length: the Unix time in seconds truncated to a multiple of the unit's
// length, like envoyproxy/ratelimit's cache keys. A state whose window is not
// older than t's is counted in its own window (time that goes backwards
// counts against the newer window).
func fixedWindow(p *Policy, s *State, t int64) (start, length, count int64) {
	length = unitSeconds(p.Window.Unit) * second
	start = floorDiv(t, length) * length
	if s.used && s.at >= start {
		return s.at, length, s.val
	}
	return start, length, 0
}

func decideFixed(p *Policy, s *State, t, k, m int64, commit bool) Decision {
	if unitSeconds(p.Window.Unit) == 0 || p.Window.Limit < 1 {
		return closed()
	}
	start, length, cnt := fixedWindow(p, s, t)
	lim := p.Window.Limit
	d := Decision{Tier: 1, TierLimit: lim, TierWindow: duration(length)}
	reset := duration(start + length - t)
	n := min(k, max(0, lim-cnt))
	if n >= m && m <= k {
		d.OK, d.Granted = true, n
		d.TierHits = cnt + n
		d.Remaining = max(0, lim-cnt-n)
		d.ResetAfter = reset
		if commit && n > 0 {
			s.used, s.at, s.val = true, start, cnt+n
		}
		return d
	}
	d.TierHits = cnt
	d.Remaining = max(0, lim-cnt)
	if need := max(m, 1); need > k || need > lim {
		d.RetryAfter = Unbounded
	} else {
		d.RetryAfter = reset
	}
	d.ResetAfter = d.RetryAfter
	return d
}

func refundFixed(p *Policy, s *State, t, hits int64) {
	if unitSeconds(p.Window.Unit) == 0 || hits <= 0 {
		return
	}
	start, _, cnt := fixedWindow(p, s, t)
	if !s.used || s.at != start {
		return
	}
	s.val = max(0, cnt-hits)
}

func forgetFixed(p *Policy, s *State) (int64, bool) {
	n := unitSeconds(p.Window.Unit)
	if n == 0 || !s.used || s.val <= 0 {
		return 0, false
	}
	return s.at + n*second, true
}
