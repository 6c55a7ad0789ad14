package tiers

// bucketUnits returns the token bucket's fixed-point parameters: one credit
// is p units, the bucket gains r units per µs, and holds at most capU units.
// p and r are Per (in µs) and Refill divided by their greatest common
// divisor, so every quantity is an exact integer. ok is false for an invalid
// bucket.
func bucketUnits(b *TokenBucket) (p, r, capU int64, ok bool) {
	per := Micros(b.Per)
	if b.Capacity < 1 || b.Refill < 1 || per < 1 || per == inf {
		return 0, 0, 0, false
	}
	g := gcd(b.Refill, per)
	p, r = per/g, b.Refill/g
	if b.Capacity > (1<<53)/p {
		return 0, 0, 0, false
	}
	return p, r, b.Capacity * p, true
}

// A bucket's state is what it owes: its deficit (capacity less balance)
// in units at its last update, with the unit it was kept in, so that a
// change of capacity applies to the credits already taken (raising a
// capacity by c grants c more at once) and a change of refill (a new unit)
// converts them.

// bucketOwed returns s's deficit at s.at in the units of a policy whose
// credit is unit units and whose capacity is capU units. A deficit kept in
// another unit (the refill or its period changed) is converted in whole
// credits, the fraction of a credit already refilling dropped (at most one
// credit early, once). It is at most twice the capacity (a balance of
// minus the capacity, the most a post-paid bucket owes), so that a
// capacity lowered far below the credits taken does not make the bucket
// owe more, and at most 2^53 units, so that every quantity of a decision
// stays exact in a double.
func bucketOwed(s *State, unit, capU int64) int64 {
	lim := min(2*capU, maxOwedUnits)
	d := max(0, s.val)
	if s.unit != unit && s.unit > 0 {
		d = min(d/s.unit, lim/unit) * unit
	}
	return min(d, lim)
}

// maxOwedUnits bounds what a bucket owes (bucketOwed).
const maxOwedUnits int64 = 1 << 53

// roomOf returns s's room (reserve.go) in the units of unit, at most capU.
func roomOf(s *State, unit, capU int64) int64 {
	if s.unit == unit || s.unit <= 0 {
		return s.room
	}
	return min(s.room/s.unit, capU/unit) * unit
}

// setBucket records the balance b (units of unit) at at.
func setBucket(s *State, b, at, unit, capU int64) {
	if s.unit != unit {
		s.room = roomOf(s, unit, capU)
	}
	s.used, s.val, s.at, s.unit = true, capU-b, at, unit
}

// balance returns the bucket's units at t: full for a new state, else the
// capacity less what it owes, which falls by r units per µs since the last
// update. Time that goes backwards accrues nothing.
func balance(s *State, t, unit, r, capU int64) int64 {
	if !s.used {
		return capU
	}
	d := bucketOwed(s, unit, capU)
	if dt := t - s.at; dt > 0 {
		if dt >= ceilDiv(d, r) {
			return capU
		}
		d -= r * dt
	}
	return capU - d
}

// maxOverdraftUnits bounds the capacity in units of a post-paid bucket, whose
// balance may fall to minus its capacity: every quantity stays below 2^53.
const maxOverdraftUnits int64 = 1 << 52

func decideBucket(p *Policy, s *State, t, k, m int64, commit bool) Decision {
	unit, r, capU, ok := bucketUnits(&p.Bucket)
	if !ok || (p.Overdraft && capU > maxOverdraftUnits) {
		return closed()
	}
	d := Decision{Tier: 1}
	b := balance(s, t, unit, r, capU)
	whole := max(0, b) / unit
	n := min(k, whole)
	if n >= m && m <= k && b >= 0 {
		b -= n * unit
		d.OK, d.Granted = true, n
		d.Remaining = b / unit
		d.TierHits = p.Bucket.Capacity - d.Remaining
		if b < capU {
			d.ResetAfter = FromMicros(ceilDiv(unit-b%unit, r))
		}
		if commit && n > 0 {
			setBucket(s, b, max(s.at, t), unit, capU)
		}
		return d
	}
	d.Remaining = whole
	if p.Overdraft {
		// Post-paid: the k hits are debited, down to minus the capacity.
		d.Remaining = 0
		if commit && k > 0 {
			if k > (b+capU)/unit {
				b = -capU
			} else {
				b -= k * unit
			}
			setBucket(s, b, max(s.at, t), unit, capU)
		}
	}
	d.TierHits = p.Bucket.Capacity - d.Remaining
	need := needed(k, m)
	if need > k || need > p.Bucket.Capacity {
		d.RetryAfter = Unbounded
	} else {
		d.RetryAfter = FromMicros(ceilDiv(need*unit-b, r))
	}
	d.ResetAfter = d.RetryAfter
	return d
}

func refundBucket(p *Policy, s *State, t, hits int64) {
	unit, r, capU, ok := bucketUnits(&p.Bucket)
	if !ok || hits <= 0 {
		return
	}
	b := balance(s, t, unit, r, capU)
	hits = min(hits, p.Bucket.Capacity)
	setBucket(s, min(capU, b+hits*unit), max(s.at, t), unit, capU)
}

func forgetBucket(p *Policy, s *State) (int64, bool) {
	unit, r, capU, ok := bucketUnits(&p.Bucket)
	if !ok || !s.used {
		return 0, false
	}
	d := bucketOwed(s, unit, capU)
	if d <= 0 {
		return s.at, true
	}
	return s.at + ceilDiv(d, r), true
}
