package memcopy

import (
	"context"
	"fmt"
	"hash/maphash"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/charonlimit/charon/copylog"
	"github.com/charonlimit/charon/internal/collect"
	"github.com/charonlimit/charon/internal/copystore"
	"github.com/charonlimit/charon/internal/periodic"
)

// Defaults and bounds of Options.
const (
	DefaultShards = 64
	MaxShards     = 256
)

// ErrClosed is returned by every operation after Close. It wraps
// copystore.ErrUnavailable: the server answers UNAVAILABLE.
var ErrClosed = fmt.Errorf("memcopy: closed: %w", copystore.ErrUnavailable)

// Options configure a Store. The zero value is usable: DefaultShards
// shards, no sweeper (operations still reap their own resource; call Reap
// to reap the others).
type Options struct {
	// Shards is the number of independently locked shards, rounded up to a
	// power of two and capped at MaxShards; 0 or less means DefaultShards.
	Shards int
	// SweepInterval, when positive, starts a goroutine that calls Reap with
	// Now() every interval until Close.
	SweepInterval time.Duration
	// Now is the sweeper's clock; nil means time.Now. Operations use the
	// now they are given, never this clock.
	Now func() time.Time
}

// Stats are the store's gauges and counters, for metrics. Gauges count
// lapsed holds and transfers until something reaps them.
type Stats struct {
	// Resources is the number of copy logs kept: those of resources
	// holding something, and those emptied since the last Reap.
	Resources int
	// Holds, Transfers and Copies are gauges: live holds, staged transfers,
	// and copies counted against the limits (those of holds and of staged
	// transfers).
	Holds     int64
	Transfers int64
	Copies    int64
	// Granted and Rejected count reserves (a replay of an idempotent
	// reserve counts as neither); Seized counts seizes.
	Granted  uint64
	Rejected uint64
	Seized   uint64
	// LeaseExpiries counts holds released because their lease lapsed,
	// whoever reaped them (an operation on the resource or Reap);
	// ReapedHolds counts those released by Reap or the sweeper (the
	// periodic reaper), a subset. TransferExpiries counts staged transfers whose
	// ttl lapsed unseized, ExpiredCopies the copies both released.
	LeaseExpiries    uint64
	ReapedHolds      uint64
	TransferExpiries uint64
	ExpiredCopies    uint64
	// SessionHolds counts holds released by ReleaseSession (sessions that
	// ended), SessionCopies their copies.
	SessionHolds  uint64
	SessionCopies uint64
}

// Store is the in-memory copy store. Safe for concurrent use; create it
// with New and Close it to stop the sweeper. Its operations never wait for
// anything but a shard's mutex, held for one copylog operation, so they do
// not consult their context.
type Store struct {
	shards  []shard
	mask    uint64
	seed    maphash.Seed
	closed  atomic.Bool
	sweeper *periodic.Loop // nil without Options.SweepInterval
}

var _ copystore.Store = (*Store)(nil)

type shard struct {
	mu     sync.Mutex
	states map[string]*copylog.State
	// tokens keeps the last fencing token of each resource whose copy log
	// was dropped empty, to seed its next one.
	tokens map[string]int64
	c      counters
	_      [64]byte
}

// counters are a shard's share of Stats, changed under the shard's lock.
type counters struct {
	holds, transfers, copies                              int64
	granted, rejected, seized                             uint64
	leaseExpiries, reapedHolds, transferExpiries, expired uint64
	sessionHolds, sessionCopies                           uint64
}

// New returns an empty Store with opts.
func New(opts Options) *Store {
	n := opts.Shards
	if n <= 0 {
		n = DefaultShards
	}
	n = min(1<<bits.Len(uint(n-1)), MaxShards)
	s := &Store{shards: make([]shard, n), mask: uint64(n - 1), seed: maphash.MakeSeed()}
	for i := range s.shards {
		s.shards[i].states = map[string]*copylog.State{}
		s.shards[i].tokens = map[string]int64{}
	}
	s.sweeper = periodic.Sweep(opts.SweepInterval, opts.Now, s.reap)
	return s
}

// Close stops the sweeper and waits for it; every operation fails with
// ErrClosed afterwards. Closing twice is harmless.
func (s *Store) Close() error {
	s.closed.Store(true)
	s.sweeper.Stop()
	return nil
}

// lock returns the locked shard of resource and its state, made (seeded
// with the resource's last token) when it had none. The caller runs one
// operation, then calls done.
func (s *Store) lock(resource string) (*shard, *copylog.State, error) {
	if s.closed.Load() {
		return nil, nil, ErrClosed
	}
	sh := &s.shards[maphash.String(s.seed, resource)&s.mask]
	sh.mu.Lock()
	st := sh.states[resource]
	if st == nil {
		st = new(copylog.State)
		st.Seed(sh.tokens[resource])
	}
	return sh, st, nil
}

// done stores st as resource's state when it is new and not empty, counts
// what the operation's reaping released, and unlocks. A copy log that
// becomes empty stays until Reap drops it, so that a resource reserved and
// released in turn does not make a new one every time.
func (sh *shard) done(resource string, st *copylog.State, copiesBefore int64, r copylog.Reaped) {
	sh.count(r, false)
	sh.c.copies += st.TotalHeld() - copiesBefore
	if !st.Empty() {
		if _, ok := sh.states[resource]; !ok {
			sh.states[resource] = st
			delete(sh.tokens, resource)
		}
	}
	sh.mu.Unlock()
}

func (sh *shard) count(r copylog.Reaped, byReap bool) {
	if r.Holds == 0 && r.Transfers == 0 {
		return
	}
	sh.c.holds -= int64(r.Holds)
	sh.c.transfers -= int64(r.Transfers)
	sh.c.leaseExpiries += uint64(r.Holds)
	sh.c.transferExpiries += uint64(r.Transfers)
	sh.c.expired += uint64(r.Copies)
	if byReap {
		sh.c.reapedHolds += uint64(r.Holds)
	}
}

// locked runs op on resource's copy log under its shard's lock, op
// counting its own outcome in c and returning what its reaping released;
// then done keeps the log and counts the rest.
func (s *Store) locked(resource string, op func(st *copylog.State, c *counters) (copylog.Reaped, error)) error {
	sh, st, err := s.lock(resource)
	if err != nil {
		return err
	}
	before := st.TotalHeld()
	r, err := op(st, &sh.c)
	sh.done(resource, st, before, r)
	return err
}

// Reserve runs copylog.Reserve on resource's copy log.
func (s *Store) Reserve(_ context.Context, now time.Time, resource string, cfg *copylog.Config, r copylog.ReserveRequest) (res copylog.Reservation, err error) {
	err = s.locked(resource, func(st *copylog.State, c *counters) (copylog.Reaped, error) {
		res, err = copylog.Reserve(cfg, st, now, r)
		switch {
		case err != nil || res.Replayed:
		case res.OK:
			c.granted++
			c.holds++
		default:
			c.rejected++
		}
		return res.Reaped, err
	})
	return res, err
}

// Release runs copylog.Release on resource's copy log.
func (s *Store) Release(_ context.Context, now time.Time, resource, holdID string, copies int64) (res copylog.ReleaseResult, err error) {
	err = s.locked(resource, func(st *copylog.State, c *counters) (copylog.Reaped, error) {
		res, err = copylog.Release(st, now, holdID, copies)
		if err == nil && res.Left == 0 {
			c.holds--
		}
		return res.Reaped, err
	})
	return res, err
}

// Transfer runs copylog.Transfer on resource's copy log.
func (s *Store) Transfer(_ context.Context, now time.Time, resource, holdID string, copies int64, ttl time.Duration, transferID string) (res copylog.TransferResult, err error) {
	err = s.locked(resource, func(st *copylog.State, c *counters) (copylog.Reaped, error) {
		res, err = copylog.Transfer(st, now, holdID, copies, ttl, transferID)
		if err == nil {
			c.transfers++
			if res.Left == 0 {
				c.holds--
			}
		}
		return res.Reaped, err
	})
	return res, err
}

// Seize runs copylog.Seize on resource's copy log.
func (s *Store) Seize(_ context.Context, now time.Time, resource, transferID, holdID, session string, lease time.Duration) (res copylog.SeizeResult, err error) {
	err = s.locked(resource, func(st *copylog.State, c *counters) (copylog.Reaped, error) {
		res, err = copylog.Seize(st, now, transferID, holdID, session, lease)
		if err == nil {
			c.transfers--
			c.holds++
			c.seized++
		}
		return res.Reaped, err
	})
	return res, err
}

// KeepAlive runs copylog.KeepAlive on resource's copy log.
func (s *Store) KeepAlive(_ context.Context, now time.Time, resource, session, holdID string, lease time.Duration) (res copylog.KeepAliveResult, err error) {
	err = s.locked(resource, func(st *copylog.State, _ *counters) (copylog.Reaped, error) {
		res, err = copylog.KeepAlive(st, now, session, holdID, lease)
		return res.Reaped, err
	})
	return res, err
}

// ReleaseSession runs copylog.ReleaseSession on resource's copy log.
func (s *Store) ReleaseSession(_ context.Context, now time.Time, resource, session string) (res copylog.SessionResult, err error) {
	err = s.locked(resource, func(st *copylog.State, c *counters) (copylog.Reaped, error) {
		res, err = copylog.ReleaseSession(st, now, session)
		if err == nil {
			c.holds -= int64(res.Holds)
			c.sessionHolds += uint64(res.Holds)
			c.sessionCopies += uint64(res.Copies)
		}
		return res.Reaped, err
	})
	return res, err
}

// Reap expires, at now, the lapsed holds and transfers of every resource
// (copylog.Expire), one shard locked at a time, and drops the copy logs
// left empty, keeping their last fencing tokens. It skips the expiry of a
// resource whose NextExpiry is after now.
func (s *Store) Reap(_ context.Context, now time.Time) error {
	if s.closed.Load() {
		return ErrClosed
	}
	s.reap(now)
	return nil
}

func (s *Store) reap(now time.Time) {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for resource, st := range sh.states {
			if next := st.NextExpiry(); !next.IsZero() && !next.After(now) {
				before := st.TotalHeld()
				r, _ := copylog.Expire(st, now) // errors only for a nil state
				sh.count(r, true)
				sh.c.copies += st.TotalHeld() - before
			}
			if st.Empty() {
				delete(sh.states, resource)
				if tok := st.Token(); tok > 0 {
					sh.tokens[resource] = tok
				}
			}
		}
		sh.mu.Unlock()
	}
}

// Stats returns the store's gauges and counters, summed over the shards
// (each shard locked in turn, so the sum is not one instant's).
func (s *Store) Stats() Stats {
	var out Stats
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		c := sh.c
		out.Resources += len(sh.states)
		sh.mu.Unlock()
		out.Holds += c.holds
		out.Transfers += c.transfers
		out.Copies += c.copies
		out.Granted += c.granted
		out.Rejected += c.rejected
		out.Seized += c.seized
		out.LeaseExpiries += c.leaseExpiries
		out.ReapedHolds += c.reapedHolds
		out.TransferExpiries += c.transferExpiries
		out.ExpiredCopies += c.expired
		out.SessionHolds += c.sessionHolds
		out.SessionCopies += c.sessionCopies
	}
	return out
}

// Tokens returns the number of resources whose copy log was dropped empty
// and whose last fencing token the store keeps (a few bytes each).
func (s *Store) Tokens() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.tokens)
		sh.mu.Unlock()
	}
	return n
}

// Collector exports the store's gauges and counters as charon_copystore_*.
func (s *Store) Collector() prometheus.Collector {
	return collect.Collector("charon", "copystore", s.Stats,
		collect.Metric[Stats]{Name: "holds", Help: "Live holds in the copy store.",
			Value: func(s Stats) float64 { return float64(s.Holds) }},
		collect.Metric[Stats]{Name: "transfers", Help: "Staged transfers in the copy store.",
			Value: func(s Stats) float64 { return float64(s.Transfers) }},
		collect.Metric[Stats]{Name: "lease_expiries_total", Help: "Holds released because their lease lapsed.", Counter: true,
			Value: func(s Stats) float64 { return float64(s.LeaseExpiries) }},
		collect.Metric[Stats]{Name: "reaped_holds_total", Help: "Holds released by the periodic reaper (a subset of lease expiries).", Counter: true,
			Value: func(s Stats) float64 { return float64(s.ReapedHolds) }},
		collect.Metric[Stats]{Name: "session_holds_total", Help: "Holds released because their session ended.", Counter: true,
			Value: func(s Stats) float64 { return float64(s.SessionHolds) }},
	)
}
