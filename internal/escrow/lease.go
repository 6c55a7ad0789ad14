package escrow

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/tiers"
)

// maxLeases is the most leases an entry holds at once: the one being spent
// and the next, taken before the first runs out.
const maxLeases = 2

// lease is a slice of a pair's budget that the shared store counts as used:
// hits reserved for the instant at (on the store's clock), of which size
// may be granted locally at the instants in [from, until) of this
// process's clock. until is the instant the reservation was asked for plus
// the lease length: the store read its clock after that, so until comes
// no later than at, and a hit granted before until is stamped no earlier
// than it is granted. from is when the check that the present counts at
// most the limit returned: a hit is granted only after its lease is
// checked (see the package documentation).
type lease struct {
	at          time.Time
	from, until time.Time
	size, used  int64
	closed      bool // given back (or dropped): nothing more is taken or undone
}

func (l *lease) left() int64 { return l.size - l.used }

// live reports whether hits of l may be granted at now.
func (l *lease) live(now time.Time) bool {
	return !l.closed && !now.Before(l.from) && now.Before(l.until)
}

// past is a lease's net size and end, kept for a window after it ends: its
// hits still count in the pair's window (fair shares, Store.occupancy).
type past struct {
	until time.Time
	n     int64
}

// entry is a pair in escrow on this replica. Its fields after mu are
// guarded by mu; the counters are atomic (Decide counts, Tick reads).
type entry struct {
	key store.Key // its own copy of the strings

	decisions, hits atomic.Int64 // since the last tick
	// want is the policy the latest request carried when it differs from
	// pol (a reload, an override): the next tick retires pol's leases.
	want atomic.Pointer[tiers.Policy]

	// pol is the policy the leases are made under (set by Tick under mu).
	pol atomic.Pointer[tiers.Policy]

	// urgent: Decide found the leases short; the next tick sees to the
	// pair whether it is due or not.
	urgent atomic.Bool

	mu sync.Mutex
	// lease is the length of the pair's leases under pol (tiers.LeaseFor).
	lease  time.Duration
	leases [maxLeases]*lease
	// refused: the last lease was refused (the pair is full) at refusedAt,
	// for retry (the store's wait for one hit): requests are rejected
	// locally until refusedUntil, and no lease is asked for before then.
	refusedAt, refusedUntil time.Time
	retry                   time.Duration
	hard, global            bool // the refusal came from the hard / global limit
	acquiring               bool // a lease call is in flight
	// lastSize is the size of the last lease; spentEarly that a lease ran
	// out before three quarters of its length (the next is twice as big).
	lastSize   int64
	spentEarly bool
	// took is how long the last lease took to arrive (its reservation
	// sent to its check's answer): a lease lasts at least three times that.
	took    time.Duration
	history []past
	// shown is what Tick last measured, for Holding.
	shownRate   float64
	shownDemand int64

	// Tick's own (only Tick touches them).
	rate, hitRate float64 // decisions and hits per second, smoothed
	hot           float64 // the rate it was found hot at (Store.hotRate)
	known         bool
	lastTick      time.Time
	nextTick      time.Time
	coldSince     time.Time
	share         int64 // fair share of the budget per window, -1 unknown
	nextRebalance time.Time
	lastRebalance time.Time
	capped        bool   // a lease was not asked for: the share was held
	recent        []past // hits per tick over the last rebalance interval
}

// take is one grant taken from a lease by a call, undone when the call
// does not commit.
type take struct {
	e *entry
	l *lease
	n int64
}

// avail returns the hits e's live leases can still grant at now. e.mu is
// held.
func (e *entry) avail(now time.Time) int64 {
	var n int64
	for _, l := range e.leases {
		if l != nil && l.live(now) {
			n += l.left()
		}
	}
	return n
}

// takeHits takes n hits from e's live leases at now, the lease that ends
// first first, appending what it took to takes when it is not nil. e.mu is
// held and avail(now) >= n.
func (e *entry) takeHits(now time.Time, n int64, takes *[]take) {
	for n > 0 {
		var best *lease
		for _, l := range e.leases {
			if l != nil && l.live(now) && l.left() > 0 && (best == nil || l.until.Before(best.until)) {
				best = l
			}
		}
		if best == nil {
			return // not reached: avail said so
		}
		k := min(n, best.left())
		best.used += k
		n -= k
		if takes != nil {
			*takes = append(*takes, take{e: e, l: best, n: k})
		}
		if best.left() == 0 && now.Before(best.from.Add(best.until.Sub(best.from)*3/4)) {
			e.spentEarly = true
		}
	}
}

// undo puts back what a call took and did not commit, in leases that are
// still open (a lease closed meanwhile was given back with those hits
// counted as used: they stay counted, which only ever grants less).
func undo(takes []take) {
	for _, t := range takes {
		t.e.mu.Lock()
		if !t.l.closed {
			t.l.used -= t.n
		}
		t.e.mu.Unlock()
	}
}

// occupancy returns the hits e's leases hold in the pair's window at now:
// the net size of every lease whose hits have not left a window of w yet
// (a lease's hits are stamped at its end). e.mu is held.
func (e *entry) occupancy(now time.Time, w time.Duration) int64 {
	var n int64
	keep := e.history[:0]
	for _, p := range e.history {
		if now.Before(p.until.Add(w)) {
			keep = append(keep, p)
			n += p.n
		}
	}
	clear(e.history[len(keep):])
	e.history = keep
	for _, l := range e.leases {
		if l != nil {
			n += l.size
		}
	}
	return n
}

// acquire asks the leaser for a lease of up to want hits of e's pair under
// pol, and installs it (see leaseCalls.take). Called by Tick with
// e.acquiring set; it clears it.
func (s *Store) acquire(ctx context.Context, e *entry, pol *tiers.Policy, want int64, length time.Duration) {
	defer func() {
		e.mu.Lock()
		e.acquiring = false
		e.mu.Unlock()
	}()
	e.mu.Lock()
	// A lease that lasts less than its calls take would arrive spent: it
	// lasts three of them at least (its hits count that much longer).
	length = max(length, 3*e.took)
	e.mu.Unlock()
	l, refused, l0, ok := s.leaseCalls().take(ctx, e.key, pol, want, length)
	if !ok {
		return
	}
	if l != nil {
		e.mu.Lock()
		e.took = l.from.Sub(l0)
		e.mu.Unlock()
		if !l.from.Before(l.until) {
			// It arrived ended: its hits go back at once, and the next
			// lease is longer.
			s.stats.late.Add(1)
			s.giveBack(ctx, e, pol, l.at, l.size)
			return
		}
	}
	if l == nil {
		e.mu.Lock()
		s.refuse(e, l0, refused, length)
		e.mu.Unlock()
		return
	}
	installed := false
	e.mu.Lock()
	// A lease retired while the calls ran (a reload, Close) is not used.
	if e.pol.Load() == pol && !s.closed.Load() {
		for i := range e.leases {
			if e.leases[i] == nil {
				e.leases[i], installed = l, true
				e.refusedUntil = time.Time{}
				break
			}
		}
	}
	e.mu.Unlock()
	if !installed {
		s.giveBack(ctx, e, pol, l.at, l.size)
		return
	}
	s.stats.leases.Add(1)
	s.stats.leasedHits.Add(uint64(l.size))
	e.mu.Lock()
	e.lastSize = l.size
	e.mu.Unlock()
}

// leaseCalls returns the calls to the Store's leaser.
func (s *Store) leaseCalls() leaseCalls {
	return leaseCalls{ls: s.leaser, timeout: s.callTimeout, now: s.now, c: &s.stats, log: s.log}
}

// leaseCalls takes leases from a leaser and gives them back, counting its
// calls in c: a replica's from the shared store (Store), a region's from
// the home (Region).
type leaseCalls struct {
	ls      Leaser
	timeout time.Duration
	now     func() time.Time
	c       *counters
	log     *slog.Logger
}

// take asks ls for a lease of up to want hits of k's pair under pol, of
// length (see the package documentation for the protocol and why it is
// exact): a reservation of the hits for the lease's last instant, then a
// check of the pair's counts at the present, its excess given back. It
// returns the lease, or, when ls refused it (the pair is full), nil and
// the refusal; ok is false when a call failed (nothing is granted). l0 is
// the instant the reservation was sent.
func (h leaseCalls) take(ctx context.Context, k store.Key, pol *tiers.Policy, want int64, length time.Duration) (l *lease, refused tiers.Decision, l0 time.Time, ok bool) {
	h.c.leaseCalls.Add(1)
	l0 = h.now()
	items := []store.Item{{Key: k, Policy: pol, Hits: want, Min: 1}}
	out := make([]tiers.Decision, 1)
	cctx, cancel := context.WithTimeout(ctx, h.timeout)
	at, err := h.ls.Reserve(cctx, l0, length, items, out)
	cancel()
	if err != nil {
		// The reservation may have been made and its answer lost: its hits
		// stay counted until the window forgets them, which only ever
		// grants less.
		h.c.leaseErrors.Add(1)
		h.log.Debug("escrow: lease not taken", "resource", k.Resource, "err", err.Error())
		return nil, tiers.Decision{}, l0, false
	}
	d := out[0]
	if !d.OK || d.Granted <= 0 {
		// Not one hit fits at the lease's last instant, so none fits now:
		// the store would reject this replica's requests too.
		h.c.leaseRefusals.Add(1)
		return nil, d, l0, true
	}
	granted := d.Granted
	// The check: the pair's counts at the present, this lease's hits
	// included. The reservation's walk at its last instant did not see the
	// hits that leave the window before it; if they and the lease exceed
	// a limit now, the excess is given back and never granted.
	h.c.leaseCalls.Add(1)
	check := []store.Item{{Key: k, Policy: pol}}
	cctx, cancel = context.WithTimeout(ctx, h.timeout)
	err = h.ls.Decide(cctx, h.now(), check, out)
	cancel()
	from := h.now()
	if err != nil {
		h.c.leaseErrors.Add(1)
		h.giveBack(ctx, k, pol, at, granted)
		return nil, tiers.Decision{}, l0, false
	}
	excess := overLimit(pol, out[0])
	if excess > 0 {
		h.c.leaseExcess.Add(uint64(min(excess, granted)))
		h.giveBack(ctx, k, pol, at, min(excess, granted))
	}
	if excess >= granted {
		h.c.leaseRefusals.Add(1)
		return nil, tiers.Decision{RetryAfter: length, LimitedByHard: out[0].LimitedByHard, LimitedByGlobal: out[0].LimitedByGlobal}, l0, true
	}
	return &lease{at: at, from: from, until: l0.Add(length), size: granted - excess}, tiers.Decision{}, l0, true
}

// giveBack gives n hits of the reservation made for at back to the
// leaser. A give-back that fails leaves them counted until the window
// forgets them: the pair is granted less meanwhile, never more.
func (h leaseCalls) giveBack(ctx context.Context, k store.Key, pol *tiers.Policy, at time.Time, n int64) {
	if n <= 0 {
		return
	}
	h.c.leaseCalls.Add(1)
	cctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	if err := h.ls.GiveBack(cctx, h.now(), at, []store.Item{{Key: k, Policy: pol, Hits: n}}); err != nil {
		h.c.giveBackErrors.Add(1)
		h.log.Debug("escrow: give-back failed", "resource", k.Resource, "hits", n, "err", err.Error())
		return
	}
	h.c.givenBack.Add(uint64(n))
}

// overLimit returns by how many hits a check's counts exceed pol's limits:
// its tier's, the hard limit's and the global limit's.
func overLimit(pol *tiers.Policy, d tiers.Decision) int64 {
	var x int64
	if d.Tier == 1 {
		x = d.TierHits - pol.Tiers[0].Limit
	}
	if pol.HardLimit > 0 {
		x = max(x, d.DomainHits-pol.HardLimit)
	}
	if pol.GlobalLimit > 0 {
		x = max(x, d.ResourceHits-pol.GlobalLimit)
	}
	return max(x, 0)
}

// refuse records that a lease asked for at l0 was refused with d: the
// pair's requests are rejected locally, and no lease asked for, until a
// lease could be granted again (d.RetryAfter after l0: a lease asked for
// then reserves for d.RetryAfter after the refused one's instant), for at
// most one lease length. e.mu is held.
func (s *Store) refuse(e *entry, l0 time.Time, d tiers.Decision, length time.Duration) {
	wait := min(max(d.RetryAfter, 0), length)
	e.refusedAt, e.refusedUntil = l0, l0.Add(wait)
	e.retry = d.RetryAfter
	e.hard, e.global = d.LimitedByHard, d.LimitedByGlobal
}

// giveBack gives n hits of e's lease reserved for at back to the leaser.
func (s *Store) giveBack(ctx context.Context, e *entry, pol *tiers.Policy, at time.Time, n int64) {
	s.leaseCalls().giveBack(ctx, e.key, pol, at, n)
}

// closeLease closes l (e.mu held) and returns what is to be given back.
func closeLease(e *entry, l *lease) int64 {
	if l.closed {
		return 0
	}
	l.closed = true
	e.history = append(e.history, past{until: l.until, n: l.used})
	return l.left()
}
