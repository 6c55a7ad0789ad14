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

// balance returns the bucket's units at t: full for a new state, else the
// stored balance plus r units per µs since the last update, at most capU.
// Time that goes backwards accrues nothing.
func balance(s *State, t, r, capU int64) int64 {
	if !s.used {
		return capU
	}
	b := min(s.val, capU)
	dt := t - s.at
	if dt <= 0 {
		return b
	}
	need := capU - b
	if dt >= ceilDiv(need, r) {
		return capU
	}
	return b + r*dt
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
	b := balance(s, t, r, capU)
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
			s.used, s.val, s.at = true, b, max(s.at, t)
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
			s.used, s.val, s.at = true, b, max(s.at, t)
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
	b := balance(s, t, r, capU)
	hits = min(hits, p.Bucket.Capacity)
	s.used, s.val, s.at = true, min(capU, b+hits*unit), max(s.at, t)
}

func forgetBucket(p *Policy, s *State) (int64, bool) {
	_, r, capU, ok := bucketUnits(&p.Bucket)
	if !ok || !s.used {
		return 0, false
	}
	if s.val >= capU {
		return s.at, true
	}
	return s.at + ceilDiv(capU-s.val, r), true
}
