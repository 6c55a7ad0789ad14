package tiers

import "time"

// Phases of a tier at an instant.
const (
	inactive = iota
	active
	cooldown
)

// numTiers is the number of tiers of p that count (at most MaxTiers, so an
// unvalidated policy cannot break the bit mask of entered tiers).
func numTiers(p *Policy) int {
	return min(len(p.Tiers), MaxTiers)
}

// phase returns the phase of tier i (1-based) at t.
func phase(p *Policy, s *State, i int, t int64) int {
	if i > len(s.tiers) {
		return inactive
	}
	ts := &s.tiers[i-1]
	if !ts.in {
		return inactive
	}
	tr := &p.Tiers[i-1]
	end := addSat(ts.entered, Micros(tr.Active))
	if t < end {
		return active
	}
	if t < addSat(end, max(0, Micros(tr.Cooldown))) {
		return cooldown
	}
	return inactive
}

// walker runs the SPEC §2 request procedure over a read-only view of the
// state at t, granting hits in chunks (a chunk fills the current tier or
// stops at a limit), so its cost does not depend on the number of copies.
type walker struct {
	p         *Policy
	s         *State
	g         *Global
	t         int64
	dom, glob int64 // the domain's and the resource's hits in the last second

	c            int    // current tier (0: the virtual tier)
	cnt          int64  // hits in tier c's window, this walk's included
	n            int64  // hits granted so far
	mask         uint64 // tiers entered by this walk (bit i-1 for tier i)
	hard, global bool   // the last run stopped at the hard / global limit
	stuckAtTiers bool   // the last run stopped for want of a tier
	debt         bool   // a post-paid state in debt at t: nothing is granted
}

// init sets the walk at the state's situation at t.
func (w *walker) init(p *Policy, s *State, g *Global, t int64) {
	*w = walker{p: p, s: s, g: g, t: t}
	w.dom = s.second.count(t, second)
	if g != nil {
		w.glob = g.second.count(t, second)
	}
	for i := numTiers(p); i >= 1; i-- {
		if phase(p, s, i, t) == active {
			w.c = i
			w.cnt = s.tiers[i-1].hits.count(t, Micros(p.Tiers[i-1].Window))
			break
		}
	}
	if p.Overdraft {
		w.debt = (w.c >= 1 && w.cnt > p.Tiers[w.c-1].Limit) ||
			(p.HardLimit > 0 && w.dom > p.HardLimit) || (p.GlobalLimit > 0 && w.glob > p.GlobalLimit)
	}
}

// debtEnd returns an instant before which a post-paid state in debt at w.t
// stays in debt with no traffic: the latest of the instants at which each
// count over its limit falls to it (the current tier's, or the end of its
// active period if sooner; the domain's and the resource's seconds).
func (w *walker) debtEnd() int64 {
	p, s, at := w.p, w.s, w.t
	if c := w.c; c >= 1 && w.cnt > p.Tiers[c-1].Limit {
		tr := &p.Tiers[c-1]
		x := s.tiers[c-1].hits.clearsAt(w.t, Micros(tr.Window), tr.Limit)
		at = max(at, min(x, addSat(s.tiers[c-1].entered, Micros(tr.Active))))
	}
	if h := p.HardLimit; h > 0 && w.dom > h {
		at = max(at, s.second.clearsAt(w.t, second, h))
	}
	if g := p.GlobalLimit; g > 0 && w.glob > g && w.g != nil {
		at = max(at, w.g.second.clearsAt(w.t, second, g))
	}
	return at
}

// target returns the tier a burst from the current tier enters, or 0.
func (w *walker) target() int {
	for j := w.c + 1; j <= numTiers(w.p); j++ {
		switch phase(w.p, w.s, j, w.t) {
		case inactive:
			return j
		case cooldown:
			if w.p.Tiers[j-1].Skippable {
				continue
			}
			return 0
		default: // active above the current tier: cannot happen
			return 0
		}
	}
	return 0
}

// run grants hits until n reaches limit or no hit can be granted.
func (w *walker) run(limit int64) {
	w.hard, w.global, w.stuckAtTiers = false, false, false
	h, g := w.p.HardLimit, w.p.GlobalLimit
	if w.debt {
		w.hard, w.global = h > 0 && w.dom > h, g > 0 && w.glob > g
		w.stuckAtTiers = !w.hard && !w.global
		return
	}
	for w.n < limit {
		take := limit - w.n
		if h > 0 {
			if w.dom+w.n >= h {
				w.hard = true
				return
			}
			take = min(take, h-w.dom-w.n)
		}
		if g > 0 {
			if w.glob+w.n >= g {
				w.global = true
				return
			}
			take = min(take, g-w.glob-w.n)
		}
		if w.c >= 1 {
			if room := w.p.Tiers[w.c-1].Limit - w.cnt; room > 0 {
				take = min(take, room)
				w.cnt += take
				w.n += take
				continue
			}
		}
		j := w.target()
		if j == 0 {
			w.stuckAtTiers = true
			return
		}
		w.c, w.cnt = j, 0
		w.mask |= 1 << (j - 1)
	}
}

// total returns how many single hits would be granted at t from the state.
func total(p *Policy, s *State, g *Global, t int64) int64 {
	var w walker
	w.init(p, s, g, t)
	w.run(maxCopies)
	return w.n
}

// decideTiers answers a KindTiers request and commits it when commit is set.
func decideTiers(p *Policy, s *State, g *Global, t, k, m int64, commit bool) Decision {
	var d Decision
	var w walker
	w.init(p, s, g, t)
	c0, cnt0 := w.c, w.cnt
	w.run(k)
	atK := w
	w.run(maxCopies)
	d.LimitedByHard, d.LimitedByGlobal = atK.hard, atK.global
	if atK.n >= m && m <= k && !atK.debt {
		d.OK = true
		d.Granted = atK.n
		d.Tier, d.TierHits = atK.c, atK.cnt
		d.Burst = atK.mask != 0
		d.DomainHits = atK.dom + atK.n
		if g != nil {
			d.ResourceHits = atK.glob + atK.n
		}
		d.Remaining = w.n - atK.n
		if p.Concurrency && atK.n > 0 {
			d.SlotsAt = time.UnixMicro(t)
		}
		if d.Tier >= 1 {
			win := Micros(p.Tiers[d.Tier-1].Window)
			oldest := t
			if atK.mask&(1<<(d.Tier-1)) == 0 {
				if at, ok := s.tiers[d.Tier-1].hits.oldest(t, win); ok {
					oldest = at
				}
			}
			d.ResetAfter = FromMicros(max(0, oldest+win-t))
		}
		if commit && atK.n > 0 {
			applyTiers(p, s, g, t, c0, cnt0, &atK)
		}
	} else {
		d.Tier, d.TierHits = c0, cnt0
		d.DomainHits = atK.dom
		if g != nil {
			d.ResourceHits = atK.glob
		}
		d.Remaining = w.n
		if p.Overdraft {
			d.Remaining = 0
			if commit {
				debitTiers(p, s, g, t, c0, cnt0, &atK, k)
			}
		}
		d.RetryAfter = FromMicros(retryTiers(p, s, g, t, k, m))
		d.ResetAfter = d.RetryAfter
	}
	return d
}

// debitTiers commits a post-paid rejection of k hits whose walk res started
// at tier c0 holding cnt0: the hits the walk could grant are committed as a
// grant would be, and the rest are debited to the tier the walk ended in
// and to the per-second logs.
func debitTiers(p *Policy, s *State, g *Global, t int64, c0 int, cnt0 int64, res *walker, k int64) {
	if res.n > 0 {
		applyTiers(p, s, g, t, c0, cnt0, res)
	}
	rest := k - res.n
	if rest <= 0 {
		return
	}
	if c := res.c; c >= 1 {
		tr := &p.Tiers[c-1]
		win := Micros(tr.Window)
		s.tiers[c-1].hits.debit(t, win, tierWidth(tr.Limit, win, s.exact), rest)
	}
	s.second.debit(t, second, secondWidth(p.HardLimit, s.exact), rest)
	if g != nil {
		g.second.debit(t, second, secondWidth(p.GlobalLimit, g.exact), rest)
	}
}

// applyTiers commits the walk res that started at tier c0 holding cnt0 hits.
func applyTiers(p *Policy, s *State, g *Global, t int64, c0 int, cnt0 int64, res *walker) {
	applyTiersAt(p, s, g, t, t, c0, cnt0, res)
}

// applyTiersAt is applyTiers for a walk at t committed at the earlier
// instant now (a reservation): the logs are pruned at now.
func applyTiersAt(p *Policy, s *State, g *Global, now, t int64, c0 int, cnt0 int64, res *walker) {
	n := numTiers(p)
	if len(s.tiers) < n {
		grown := make([]tierState, n)
		copy(grown, s.tiers)
		s.tiers = grown
	}
	addTo := func(i int, hits int64) {
		tr := &p.Tiers[i-1]
		win := Micros(tr.Window)
		s.tiers[i-1].hits.addAt(now, t, win, tierWidth(tr.Limit, win, s.exact), hits)
	}
	if res.mask == 0 {
		addTo(c0, res.n)
	} else {
		if c0 >= 1 {
			if x := p.Tiers[c0-1].Limit - cnt0; x > 0 {
				addTo(c0, x)
			}
		}
		for j := c0 + 1; j <= res.c; j++ {
			if res.mask&(1<<(j-1)) == 0 {
				continue
			}
			ts := &s.tiers[j-1]
			ts.in, ts.entered = true, t
			ts.hits.reset()
			if j == res.c {
				addTo(j, res.cnt)
			} else {
				addTo(j, p.Tiers[j-1].Limit)
			}
		}
	}
	s.second.addAt(now, t, second, secondWidth(p.HardLimit, s.exact), res.n)
	if g != nil {
		g.second.addAt(now, t, second, secondWidth(p.GlobalLimit, g.exact), res.n)
	}
}

// retryTiers returns the wait in µs until a request of m hits (and at most
// k) would be granted with no other traffic, or inf. It evaluates the
// procedure at every instant after t at which the state's meaning changes (a
// bucket leaves a window, a tier changes phase), in increasing order: the
// number of grantable hits is constant between two such instants.
func retryTiers(p *Policy, s *State, g *Global, t, k, m int64) int64 {
	need := needed(k, m)
	if need > k || (need > 0 && numTiers(p) == 0) ||
		(p.HardLimit > 0 && need > p.HardLimit) || (p.GlobalLimit > 0 && need > p.GlobalLimit) {
		return inf
	}
	cur := t
	for {
		next, ok := nextEvent(p, s, g, cur)
		if !ok {
			return inf
		}
		cur = next
		var w walker
		w.init(p, s, g, cur)
		if w.debt {
			// No instant before the debt can end grants: go to it (an
			// instant nextEvent names) rather than through every bucket's.
			if x := w.debtEnd(); x > cur {
				cur = x - 1
				continue
			}
		}
		w.run(need)
		if w.n >= need && !w.debt {
			return cur - t
		}
	}
}

// nextEvent returns the earliest instant after t at which the meaning of the
// state changes.
func nextEvent(p *Policy, s *State, g *Global, t int64) (int64, bool) {
	best, found := inf, false
	consider := func(x int64, ok bool) {
		if ok && x > t && x < best {
			best, found = x, true
		}
	}
	for i := 1; i <= numTiers(p) && i <= len(s.tiers); i++ {
		ts := &s.tiers[i-1]
		if !ts.in {
			continue
		}
		tr := &p.Tiers[i-1]
		end := addSat(ts.entered, Micros(tr.Active))
		consider(end, end != inf)
		cend := addSat(end, max(0, Micros(tr.Cooldown)))
		consider(cend, cend != inf)
		if t < end { // only an active tier's hits matter: no tier is entered without traffic
			consider(ts.hits.nextExpiry(t, Micros(tr.Window)))
		}
	}
	consider(s.second.nextExpiry(t, second))
	if g != nil {
		consider(g.second.nextExpiry(t, second))
	}
	return best, found
}

// refundTiers removes up to hits of the newest hits of the current tier's
// window, and as many from the last second's counts. A concurrency limit
// removes the oldest slots instead, or with slots (at >= 0) those of the
// take at at.
func refundTiers(p *Policy, s *State, g *Global, t, at, hits int64) {
	var w walker
	w.init(p, s, g, t)
	if w.c == 0 || hits <= 0 {
		return
	}
	var n int64
	log, win := &s.tiers[w.c-1].hits, Micros(p.Tiers[w.c-1].Window)
	switch {
	case !p.Concurrency:
		n = log.removeNewest(t, win, hits)
	case at >= 0:
		n = log.removeSlots(t, at, win, tierWidth(p.Tiers[w.c-1].Limit, win, s.exact), hits)
	default:
		n = log.removeOldest(t, win, hits)
	}
	s.second.removeNewest(t, second, n)
	if g != nil {
		g.second.removeNewest(t, second, n)
	}
}

// forgetTiers returns the instant in µs from which forgetting s changes no
// decision, or ok false when s holds nothing.
func forgetTiers(p *Policy, s *State) (int64, bool) {
	best, found := int64(0), false
	consider := func(x int64) {
		if !found || x > best {
			best, found = x, true
		}
	}
	for i := 1; i <= len(s.tiers); i++ {
		ts := &s.tiers[i-1]
		if !ts.in {
			continue
		}
		if i > numTiers(p) {
			continue // a tier the policy no longer has
		}
		tr := &p.Tiers[i-1]
		a := Micros(tr.Active)
		if a != inf {
			consider(addSat(addSat(ts.entered, a), max(0, Micros(tr.Cooldown))))
			continue
		}
		if i > 1 {
			return inf, true
		}
		// The first tier, active for ever: once its window is empty,
		// forgetting it only changes the next request's Burst flag.
		if at, ok := ts.hits.last(); ok {
			consider(at + Micros(tr.Window))
		}
	}
	if at, ok := s.second.last(); ok {
		consider(at + second)
	}
	return best, found
}
