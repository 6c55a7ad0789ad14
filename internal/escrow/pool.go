package escrow

import (
	"context"
	"sync"
	"time"
)

// Pool keeps a region's slices of its pairs' home budgets, shared by the
// region's replicas: its Redis (NewRedisPool) or, in one process,
// memory (NewMemPool). A slice is the unused part of a lease a Region
// took from the home, named by the lease's instant at the home (its id),
// open for replicas to take sub-leases from until its end on the pool's
// clock. Pairs are named by a string of the caller's (poolKey).
type Pool interface {
	// Take takes up to want hits of pair k from its open slice that stays
	// open at least need more, the one that ends first, and returns them
	// with that slice's id (n is 0 when no slice has hits open that
	// long), and k's state after the take. Take of 0 hits is a read of
	// the state.
	Take(ctx context.Context, k string, want int64, need time.Duration) (n, id int64, st PoolState, err error)
	// Put puts n hits back into slice id of k while it is open, and
	// reports whether it did: a slice that ended or was closed takes
	// nothing, and the caller gives the hits back to the home.
	Put(ctx context.Context, k string, id, n int64) (bool, error)
	// Add opens slice id of k, of n hits, until end on the pool's clock
	// (an instant of PoolState.At): a slice whose end has passed is not
	// opened, so that an Add that arrives late opens nothing. A slice of
	// that id still open gets the n hits added and the later end: two
	// leases the home reserved for one instant are one reservation there,
	// and each ends no later than that instant.
	Add(ctx context.Context, k string, id, n int64, end time.Time) error
	// Close closes slice id of k and returns the hits it had left (0 when
	// it was closed already): they are the closer's to give back.
	Close(ctx context.Context, k string, id int64) (int64, error)
	// Refuse records that the home refused a slice of k: Take reports it
	// (PoolState.Refused) for d.
	Refuse(ctx context.Context, k string, d time.Duration, r Refusal) error
	// Report records owner's demand for k (hits per second; 0 withdraws
	// it) and returns the region's: the sum of the demands its owners
	// reported within ttl.
	Report(ctx context.Context, k, owner string, rate float64, ttl time.Duration) (float64, error)
	// Lock takes k's refill lock for owner for ttl, and reports whether it
	// did; Unlock releases it when owner holds it.
	Lock(ctx context.Context, k, owner string, ttl time.Duration) (bool, error)
	Unlock(ctx context.Context, k, owner string) error
}

// Refusal is what the home answered when it refused a slice.
type Refusal struct {
	// Retry is the home's wait for one hit, from the refused lease's last
	// instant (tiers.Unbounded: never).
	Retry        time.Duration
	Hard, Global bool
}

// PoolState is a pair's state in a Pool.
type PoolState struct {
	// Left is the hits of the slices open for at least the need asked
	// with; Open how long the slice that ends last stays open.
	Left int64
	Open time.Duration
	// Refused, when positive, is how much longer the home's refusal
	// stands, with its Refusal.
	Refused time.Duration
	Refusal Refusal
	// At is the pool's clock when it answered.
	At time.Time
}

// NewMemPool returns a Pool in this process's memory on the clock now
// (nil: time.Now), for replicas of one process (tests, the simulation).
func NewMemPool(now func() time.Time) Pool {
	if now == nil {
		now = time.Now
	}
	return &memPool{now: now, pairs: map[string]*memPair{}}
}

type memPool struct {
	now   func() time.Time
	mu    sync.Mutex
	pairs map[string]*memPair
}

type memPair struct {
	slices       map[int64]*memSlice
	demand       map[string]memDemand
	refusedUntil time.Time
	refusal      Refusal
	owner        string
	lockedUntil  time.Time
}

type memDemand struct {
	rate float64
	at   time.Time
}

type memSlice struct {
	left int64
	end  time.Time
}

func (p *memPool) pair(k string) *memPair {
	m := p.pairs[k]
	if m == nil {
		m = &memPair{slices: map[int64]*memSlice{}, demand: map[string]memDemand{}}
		p.pairs[k] = m
	}
	return m
}

func (p *memPool) Take(_ context.Context, k string, want int64, need time.Duration) (int64, int64, PoolState, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now, m := p.now(), p.pair(k)
	var st PoolState
	var best int64
	var bestSlice *memSlice
	for id, s := range m.slices {
		if !now.Before(s.end.Add(poolForget)) {
			delete(m.slices, id)
			continue
		}
		st.Open = max(st.Open, s.end.Sub(now))
		if s.end.Sub(now) >= need && s.left > 0 {
			st.Left += s.left
			if bestSlice == nil || s.end.Before(bestSlice.end) || s.end.Equal(bestSlice.end) && id < best {
				best, bestSlice = id, s
			}
		}
	}
	var n int64
	if bestSlice != nil && want > 0 {
		n = min(want, bestSlice.left)
		bestSlice.left -= n
		st.Left -= n
	}
	st.At = now
	if now.Before(m.refusedUntil) {
		st.Refused, st.Refusal = m.refusedUntil.Sub(now), m.refusal
	}
	if n == 0 {
		best = 0
	}
	return n, best, st, nil
}

func (p *memPool) Put(_ context.Context, k string, id, n int64) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.pair(k)
	s := m.slices[id]
	if s == nil || !p.now().Before(s.end) {
		return false, nil
	}
	s.left += n
	return true, nil
}

func (p *memPool) Add(_ context.Context, k string, id, n int64, end time.Time) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.now().Before(end) {
		return nil
	}
	m := p.pair(k)
	if sl := m.slices[id]; sl != nil {
		sl.left += n
		sl.end = later(sl.end, end)
		return nil
	}
	m.slices[id] = &memSlice{left: n, end: end}
	return nil
}

func (p *memPool) Close(_ context.Context, k string, id int64) (int64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.pair(k)
	s := m.slices[id]
	if s == nil {
		return 0, nil
	}
	delete(m.slices, id)
	return max(s.left, 0), nil
}

func (p *memPool) Refuse(_ context.Context, k string, d time.Duration, r Refusal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.pair(k)
	m.refusedUntil, m.refusal = p.now().Add(d), r
	return nil
}

func (p *memPool) Report(_ context.Context, k, owner string, rate float64, ttl time.Duration) (float64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m, now := p.pair(k), p.now()
	if rate > 0 {
		m.demand[owner] = memDemand{rate: rate, at: now}
	} else {
		delete(m.demand, owner)
	}
	var sum float64
	for o, d := range m.demand {
		if now.Sub(d.at) > ttl {
			delete(m.demand, o)
			continue
		}
		sum += d.rate
	}
	return sum, nil
}

func (p *memPool) Lock(_ context.Context, k, owner string, ttl time.Duration) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m, now := p.pair(k), p.now()
	if m.owner != "" && now.Before(m.lockedUntil) {
		return false, nil
	}
	m.owner, m.lockedUntil = owner, now.Add(ttl)
	return true, nil
}

func (p *memPool) Unlock(_ context.Context, k, owner string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if m := p.pair(k); m.owner == owner {
		m.owner = ""
	}
	return nil
}

// poolForget is how long after its end a slice no one closed (its
// Region stopped) is forgotten: its hits stay counted at the home until
// the home's window forgets them.
const poolForget = time.Minute

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
