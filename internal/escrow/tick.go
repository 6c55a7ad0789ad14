package escrow

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/charonlimit/charon/fairshare"
	"github.com/charonlimit/charon/internal/sharestore"
	"github.com/charonlimit/charon/tiers"
)

// parallel bounds the pairs whose leaser calls one Tick runs at once.
const parallel = 16

// loop calls Tick every quarter of the shortest lease, and at once when
// Decide found leases short, until Close.
func (s *Store) loop() {
	defer close(s.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-s.stop
		cancel()
	}()
	t := time.NewTimer(time.Duration(s.step.Load()))
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		case <-s.wake:
		}
		s.Tick(ctx)
		t.Reset(time.Duration(s.step.Load()))
	}
}

// Tick does the periodic work of escrow at the clock's now, for each pair
// a quarter lease after its last (or at once when Decide found its leases
// short), and returns once every leaser call it made has returned: it
// updates each pair's decision rate; gives back what ended leases did not grant; retires the
// leases of a policy no longer in force; takes a pair whose rate stayed
// under half the threshold for CoolOff out of escrow; computes fair
// shares every Rebalance; and asks for a lease for a pair whose leases
// will not last until the next tick. Options.Run calls it; tests call it
// with a clock of their own.
func (s *Store) Tick(ctx context.Context) {
	s.tickMu.Lock()
	defer s.tickMu.Unlock()
	if s.closed.Load() {
		return
	}
	now := s.now()
	s.hot.rotate(now)
	rules := s.rules.Load()
	var wg sync.WaitGroup
	sem := make(chan struct{}, parallel)
	shortest := s.lease
	s.entries.Range(func(k, v any) bool {
		e := v.(*entry)
		e.mu.Lock()
		shortest = min(shortest, e.lease)
		e.mu.Unlock()
		if urgent := e.urgent.Swap(false); now.Before(e.nextTick) && !urgent {
			return true
		}
		work := s.tickEntry(ctx, e, now, rules)
		e.mu.Lock()
		e.nextTick = now.Add(e.lease / 4)
		e.mu.Unlock()
		if work != nil {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				work()
			}()
		}
		return true
	})
	wg.Wait()
	s.step.Store(int64(max(shortest/4, time.Millisecond)))
}

// tickEntry does e's part of a tick that needs no call, and returns the
// calls to make (give-backs, a rebalance, a lease), or nil.
func (s *Store) tickEntry(ctx context.Context, e *entry, now time.Time, rules *ruleSet) func() {
	// The rates, smoothed over about a second.
	e.mu.Lock()
	length := e.lease
	e.mu.Unlock()
	dt := length / 4
	if !e.lastTick.IsZero() {
		dt = now.Sub(e.lastTick)
	}
	e.lastTick = now
	n, h := e.decisions.Swap(0), e.hits.Swap(0)
	// The demand a replica reports for fair shares: its hits over the last
	// rebalance interval, so that a shift shows in full at the next round.
	e.recent = append(e.recent, past{until: now, n: h})
	var recent int64
	keep := e.recent[:0]
	for _, r := range e.recent {
		if now.Sub(r.until) < s.rebal {
			keep = append(keep, r)
			recent += r.n
		}
	}
	e.recent = keep
	if dt > 0 {
		a := 1 - math.Exp(-dt.Seconds()/time.Second.Seconds())
		r, hr := float64(n)/dt.Seconds(), float64(h)/dt.Seconds()
		if !e.known {
			e.rate, e.hitRate, e.known = r, hr, true
		} else {
			e.rate += a * (r - e.rate)
			e.hitRate += a * (hr - e.hitRate)
		}
	}
	pol := e.pol.Load()
	var back []func()
	retireAll := false
	if want := e.want.Swap(nil); want != nil && want != pol {
		// A new policy for the pair: the leases of the old one are
		// retired, and the pair leases under the new one if it may.
		retireAll = true
		pol = want
		if !rules.allows(want, s) {
			pol = nil
		}
	}
	switch {
	case pol != nil && !rules.allows(pol, s):
		pol = nil // escrow turned off for its rule, or the rule is gone
	case e.rate < e.hot/2:
		if e.coldSince.IsZero() {
			e.coldSince = now
		} else if now.Sub(e.coldSince) >= CoolOff {
			pol = nil
		}
	default:
		e.coldSince = time.Time{}
	}
	if pol == nil {
		// Out of escrow.
		s.entries.Delete(e.key)
		s.nkeys.Add(-1)
		s.stats.left.Add(1)
		s.log.Debug("escrow: a pair is cold", "resource", e.key.Resource, "domain", e.key.Domain)
		return func() { s.retire(ctx, e, func(*lease) bool { return true }) }
	}
	old := e.pol.Load()
	e.mu.Lock()
	e.shownRate = e.rate
	e.shownDemand = fairshare.Demand(float64(recent)/s.rebal.Seconds(), pol.Tiers[0].Window)
	for i, l := range e.leases {
		if l == nil {
			continue
		}
		if l.closed {
			e.leases[i] = nil
			continue
		}
		if l.left() == 0 && !retireAll && now.Before(l.until) {
			// Spent: its slot is free for the next lease.
			closeLease(e, l)
			e.leases[i] = nil
			continue
		}
		if retireAll || !now.Before(l.until) {
			if !now.Before(l.until) {
				s.stats.expired.Add(1)
			}
			if n := closeLease(e, l); n > 0 {
				at := l.at
				back = append(back, func() { s.giveBack(ctx, e, old, at, n) })
			}
			e.leases[i] = nil
		}
	}
	if retireAll {
		e.history = nil
		e.pol.Store(pol)
		e.lease, _ = tiers.LeaseFor(pol, s.lease)
		e.hot = s.hotRate(pol)
		length = e.lease
	}
	// A lease when the live ones will not last until the next tick (at the
	// rate seen) or end before it, and a slot is free.
	var want int64
	if !e.acquiring && !now.Before(e.refusedUntil) {
		// Ticks come every quarter lease: a lease is taken when the
		// leases will not last past the next one and a half.
		lead := length * 3 / 8
		var left int64
		var last time.Time
		free, used := false, false
		for _, l := range e.leases {
			if l == nil {
				free = true
				continue
			}
			left += l.left()
			if l.until.After(last) {
				last = l.until
				used = l.used > 0
			}
		}
		// The rate: the smoothed one, or the last rebalance interval's
		// when higher (a rising demand shows there first).
		rate := max(e.hitRate, float64(recent)/s.rebal.Seconds())
		need := last.IsZero() || float64(left) <= rate*lead.Seconds() || (used && last.Sub(now) < lead)
		if free && need {
			want = int64(math.Ceil(rate * length.Seconds() * headroom))
			if e.spentEarly {
				// The last lease ran out early: demand outgrows the rate.
				want = max(want, 2*e.lastSize)
				e.spentEarly = false
			}
			want = min(max(want, 1), pol.Tiers[0].Limit)
			e.acquiring = true
		}
	}
	e.mu.Unlock()
	// Fair shares are computed at the same instants on every replica (a
	// multiple of Rebalance on the clock), so that a share one releases is
	// taken by the others in the same round or at their second look: a
	// replica held at its share looks again half a round after its last.
	rebalance := s.size == SizeFair && (!now.Before(e.nextRebalance) ||
		e.capped && now.Sub(e.lastRebalance) >= s.rebal/2)
	rate := float64(recent) / s.rebal.Seconds()
	if rebalance {
		e.capped, e.lastRebalance, e.nextRebalance = false, now, now.Truncate(s.rebal).Add(s.rebal)
	}
	if len(back) == 0 && want == 0 && !rebalance {
		return nil
	}
	return func() {
		for _, f := range back {
			f()
		}
		if rebalance {
			s.rebalance(ctx, e, pol, rate, now)
		}
		if want == 0 {
			return
		}
		if s.size == SizeFair {
			e.mu.Lock()
			room := e.share - e.occupancy(now, pol.Tiers[0].Window)
			if e.share < 0 {
				room = 0 // no share yet: the shared path until there is one
			}
			e.mu.Unlock()
			if want = min(want, room); want <= 0 {
				s.stats.overShare.Add(1)
				e.mu.Lock()
				e.acquiring, e.capped = false, true
				e.mu.Unlock()
				return
			}
		}
		s.acquire(ctx, e, pol, want, length)
	}
}

// rebalance asks the share store for this replica's fair share of e's
// pair, by the hits per window it sees (a failure keeps the last share).
func (s *Store) rebalance(ctx context.Context, e *entry, pol *tiers.Policy, rate float64, now time.Time) {
	w := pol.Tiers[0].Window
	b := sharestore.Budget{Key: budgetKey(e), Limit: pol.Tiers[0].Limit}
	d := []sharestore.Demand{{ID: s.id, Demand: fairshare.Demand(rate, w)}}
	cctx, cancel := context.WithTimeout(ctx, s.callTimeout)
	defer cancel()
	shares, err := s.shares.Allocate(cctx, now, b, d, 3*s.rebal, tolerance)
	if err != nil || len(shares) != 1 {
		s.stats.rebalanceErrors.Add(1)
		return
	}
	s.stats.rebalances.Add(1)
	e.mu.Lock()
	e.share = shares[0]
	e.mu.Unlock()

}

// budgetKey names e's pair in the share store: apart from RLQS's budgets
// (a resource, a policy ID, a domain), by the escrow prefix.
func budgetKey(e *entry) string {
	return "escrow:" + e.key.Resource + ":" + strconv.FormatUint(e.key.PolicyID, 16) + ":" + e.key.Domain
}

// retire closes e's leases that match and gives back what they did not
// grant.
func (s *Store) retire(ctx context.Context, e *entry, match func(*lease) bool) {
	pol := e.pol.Load()
	type give struct {
		at time.Time
		n  int64
	}
	var gives []give
	e.mu.Lock()
	for i, l := range e.leases {
		if l != nil && match(l) {
			if n := closeLease(e, l); n > 0 {
				gives = append(gives, give{l.at, n})
			}
			e.leases[i] = nil
		}
	}
	e.mu.Unlock()
	for _, g := range gives {
		s.giveBack(ctx, e, pol, g.at, g.n)
	}
}

// randomID names this replica in the share store.
func randomID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "escrow-" + hex.EncodeToString(b[:])
}
