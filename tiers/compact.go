package tiers

import "time"

// ClosedCompact is the first integer of the compact form of a policy that
// never grants (and of a port's state kept under it).
const ClosedCompact = 3

// QuotaCompact is the first integer of the compact form of a calendar quota
// (KindQuota).
const QuotaCompact = 4

// AppendCompact appends p's compact form to dst and returns the extended
// slice. The compact form is what a port of this package's procedure (the
// Redis store's function) reads to decide under p: integers, with every
// quantity derived from the policy (the hit logs' bucket widths, a token
// bucket's fixed-point units, a unit's length) computed here, so that no
// port derives them again. Durations are in µs (Micros), math.MaxInt64
// standing for Unbounded; every other integer is below 2^53 for a valid
// policy. By its first integer:
//
//	0  KindTiers:       0, H, G, width of the domain's per-second log,
//	                    width of the resource's per-second log, n, then per
//	                    tier: limit, window, active, cooldown, skippable (0
//	                    or 1), width of its log
//	1  KindTokenBucket: 1, p, r, capacity in units (cap), capacity
//	2  KindFixedWindow: 2, limit, the unit's length
//	3  a policy that never grants: a token bucket or fixed window that is
//	   not valid, an unknown kind
//	4  KindQuota:       4, limit, post-paid (0 or 1), then the
//	                    QuotaTableLen period boundaries around now
//	                    (Quota.AppendBounds); only AppendCompactAt writes
//	                    them, AppendCompact writes those of the zero Time
//
// A post-paid policy (Overdraft) of kind 0, 1 or 2 ends with one more
// integer, 1, and a concurrency limit (Concurrency, kind 0) with one more
// integer, 2 (the two never go together); any other policy's form ends
// where the list above does.
//
// The widths and p, r and cap are those of doc.go (width 1: exact
// timestamps). At most MaxTiers tiers are written; a negative cooldown is
// written as 0. A KindTiers policy with no tiers is written as such (n = 0),
// and rejects every request as Request does.
func (p *Policy) AppendCompact(dst []int64) []int64 {
	return p.AppendCompactAt(dst, time.Time{})
}

// AppendCompactAt is AppendCompact for a port deciding near now: a calendar
// quota's form carries the boundaries of the periods around now, so that
// the port picks its period from them and never computes a calendar. The
// form of every other kind does not depend on now.
func (p *Policy) AppendCompactAt(dst []int64, now time.Time) []int64 {
	switch p.Kind {
	case KindQuota:
		if _, known := windowLimit(p); known && p.Quota.Limit >= 1 {
			od := int64(0)
			if p.Overdraft {
				od = 1
			}
			return p.Quota.AppendBounds(append(dst, QuotaCompact, p.Quota.Limit, od), now)
		}
	case KindTiers:
		n := numTiers(p)
		dst = append(dst, int64(KindTiers), p.HardLimit, p.GlobalLimit,
			secondWidth(p.HardLimit, false), secondWidth(p.GlobalLimit, false), int64(n))
		for _, t := range p.Tiers[:n] {
			win := Micros(t.Window)
			skip := int64(0)
			if t.Skippable {
				skip = 1
			}
			dst = append(dst, t.Limit, win, Micros(t.Active), max(0, Micros(t.Cooldown)), skip, tierWidth(t.Limit, win, false))
		}
		if p.Concurrency && !p.Overdraft {
			return append(dst, 2)
		}
		return p.appendOverdraft(dst)
	case KindTokenBucket:
		if unit, r, capU, ok := bucketUnits(&p.Bucket); ok && !(p.Overdraft && capU > maxOverdraftUnits) {
			return p.appendOverdraft(append(dst, int64(KindTokenBucket), unit, r, capU, p.Bucket.Capacity))
		}
	case KindFixedWindow:
		if l := unitMicros(p.Window.Unit); l != 0 && p.Window.Limit >= 1 {
			return p.appendOverdraft(append(dst, int64(KindFixedWindow), p.Window.Limit, l))
		}
	}
	return append(dst, ClosedCompact)
}

func (p *Policy) appendOverdraft(dst []int64) []int64 {
	if p.Overdraft {
		return append(dst, 1)
	}
	return dst
}

// FillLimits sets the fields of d that follow from p and d.Tier alone:
// HardLimit and GlobalLimit (those of p for KindTiers, else 0), TierLimit
// and TierWindow (those of tier d.Tier, 0 for tier 0 or a tier p does not
// have). Request and Peek set them so; a store whose decisions come from a
// port of the procedure (which answers the other fields) calls it to
// complete them. It is safe for concurrent use and does not allocate.
func (p *Policy) FillLimits(d *Decision) {
	d.HardLimit, d.GlobalLimit, d.TierLimit, d.TierWindow = 0, 0, 0, 0
	switch p.Kind {
	case KindTiers:
		d.HardLimit, d.GlobalLimit = p.HardLimit, p.GlobalLimit
		if d.Tier >= 1 && d.Tier <= numTiers(p) {
			d.TierLimit, d.TierWindow = p.Tiers[d.Tier-1].Limit, p.Tiers[d.Tier-1].Window
		}
	case KindTokenBucket:
		// A bucket's tier 1 lasts the time to refill it fully.
		if _, r, capU, ok := bucketUnits(&p.Bucket); ok && d.Tier == 1 {
			d.TierLimit, d.TierWindow = p.Bucket.Capacity, FromMicros(ceilDiv(capU, r))
		}
	case KindFixedWindow:
		if l := unitMicros(p.Window.Unit); l != 0 && d.Tier == 1 {
			d.TierLimit, d.TierWindow = p.Window.Limit, FromMicros(l)
		}
	case KindQuota:
		// A period's length depends on the period (Quota.Bounds): only the
		// limit is set.
		if d.Tier == 1 {
			d.TierLimit = p.Quota.Limit
		}
	}
}
