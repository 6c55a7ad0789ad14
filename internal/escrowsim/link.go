package escrowsim

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/charonlimit/charon/internal/escrow"
	"github.com/charonlimit/charon/internal/sharestore"
	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/tiers"
)

// ErrCut is the error of a call on a link that is cut: the region cannot
// reach the home.
var ErrCut = errors.New("escrowsim: the link to the home is cut")

// ErrKilled is the error of every call a killed replica makes.
var ErrKilled = errors.New("escrowsim: the replica is killed")

// link is one region's way to the home store: every call waits half the
// round trip on its way there and half on its way back, and is decided on
// the home's clock when it arrives (as Redis decides on its own), not at
// the instant its caller read. A cut link fails the calls that arrive
// while it is cut, and loses the answers of those that return while it is
// cut (the call was decided, its caller is told it failed). Safe for
// concurrent use.
type link struct {
	home   *homeStore
	oneWay time.Duration
	cut    atomic.Bool
	calls  *atomic.Uint64 // every call sent, over every link
}

var _ escrow.Leaser = (*link)(nil)

// stampKey carries, in a request's context, where the home writes the
// instant it decided the request: the instant a grant from the shared path
// counts from.
type stampKey struct{}

// withStamp returns ctx carrying t, which a call on the home sets to the
// instant the home decided it.
func withStamp(ctx context.Context, t *time.Time) context.Context {
	return context.WithValue(ctx, stampKey{}, t)
}

// travel waits d, or until ctx is done.
func travel(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// call sends f to the home: half the round trip, f at the home's present
// (unless the link is cut), half the round trip back (its answer lost if
// the link is cut by then).
func (l *link) call(ctx context.Context, f func(now time.Time) error) error {
	l.calls.Add(1)
	if err := travel(ctx, l.oneWay); err != nil {
		return err
	}
	if l.cut.Load() {
		return ErrCut
	}
	now, err := l.home.do(f)
	if t, ok := ctx.Value(stampKey{}).(*time.Time); ok {
		*t = now
	}
	if err := travel(ctx, l.oneWay); err != nil {
		return err
	}
	if l.cut.Load() {
		return ErrCut
	}
	return err
}

func (l *link) Decide(ctx context.Context, _ time.Time, items []store.Item, out []tiers.Decision) error {
	return l.call(ctx, func(now time.Time) error { return l.home.store.Decide(ctx, now, items, out) })
}

func (l *link) Reserve(ctx context.Context, _ time.Time, after time.Duration, items []store.Item, out []tiers.Decision) (time.Time, error) {
	var at time.Time
	err := l.call(ctx, func(now time.Time) (err error) {
		at, err = l.home.store.Reserve(ctx, now, after, items, out)
		return err
	})
	return at, err
}

func (l *link) GiveBack(ctx context.Context, _, at time.Time, items []store.Item) error {
	return l.call(ctx, func(now time.Time) error { return l.home.store.GiveBack(ctx, now, at, items) })
}

// Close does nothing: the home belongs to the run.
func (l *link) Close() error { return nil }

// homeStore is the home: the memory store, on its own clock, deciding one
// call at a time in the order of the instants it decides them at (its
// clock is read under its lock), as a single Redis does.
type homeStore struct {
	mu    sync.Mutex
	store escrow.Leaser
}

// do runs f at the home's present, which it returns.
func (h *homeStore) do(f func(now time.Time) error) (time.Time, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := time.Now()
	return now, f(now)
}

// killable is a Leaser that fails every call once its replica is killed,
// so that a killed replica (its store, its region's Region) gives nothing
// back and renews nothing: its leases and slices stay counted until they
// expire, as a process that died would leave them. calls, when not nil,
// counts the calls made. Safe for concurrent use.
type killable struct {
	l     escrow.Leaser
	dead  *atomic.Bool
	calls *atomic.Uint64
}

var _ escrow.Leaser = killable{}

func (k killable) alive() bool {
	if k.dead.Load() {
		return false
	}
	if k.calls != nil {
		k.calls.Add(1)
	}
	return true
}

func (k killable) Decide(ctx context.Context, now time.Time, items []store.Item, out []tiers.Decision) error {
	if !k.alive() {
		return ErrKilled
	}
	return k.l.Decide(ctx, now, items, out)
}

func (k killable) Reserve(ctx context.Context, now time.Time, after time.Duration, items []store.Item, out []tiers.Decision) (time.Time, error) {
	if !k.alive() {
		return time.Time{}, ErrKilled
	}
	return k.l.Reserve(ctx, now, after, items, out)
}

func (k killable) GiveBack(ctx context.Context, now, at time.Time, items []store.Item) error {
	if !k.alive() {
		return ErrKilled
	}
	return k.l.GiveBack(ctx, now, at, items)
}

// Close does nothing: what k wraps belongs to the run.
func (k killable) Close() error { return nil }

// killableShares is a replica's way to its region's share store.
type killableShares struct {
	s    sharestore.Store
	dead *atomic.Bool
}

func (k killableShares) Allocate(ctx context.Context, now time.Time, b sharestore.Budget, mine []sharestore.Demand, ttl time.Duration, tolerance float64) ([]int64, error) {
	if k.dead.Load() {
		return nil, ErrKilled
	}
	return k.s.Allocate(ctx, now, b, mine, ttl, tolerance)
}

// killablePool is a replica's Region's way to its region's pool.
type killablePool struct {
	p    escrow.Pool
	dead *atomic.Bool
}

var _ escrow.Pool = killablePool{}

func (k killablePool) Take(ctx context.Context, key string, want int64, need time.Duration) (int64, int64, escrow.PoolState, error) {
	if k.dead.Load() {
		return 0, 0, escrow.PoolState{}, ErrKilled
	}
	return k.p.Take(ctx, key, want, need)
}

func (k killablePool) Report(ctx context.Context, key, owner string, rate float64, ttl time.Duration) (float64, error) {
	if k.dead.Load() {
		return 0, ErrKilled
	}
	return k.p.Report(ctx, key, owner, rate, ttl)
}

func (k killablePool) Put(ctx context.Context, key string, id, n int64) (bool, error) {
	if k.dead.Load() {
		return false, ErrKilled
	}
	return k.p.Put(ctx, key, id, n)
}

func (k killablePool) Add(ctx context.Context, key string, id, n int64, end time.Time) error {
	if k.dead.Load() {
		return ErrKilled
	}
	return k.p.Add(ctx, key, id, n, end)
}

func (k killablePool) Close(ctx context.Context, key string, id int64) (int64, error) {
	if k.dead.Load() {
		return 0, ErrKilled
	}
	return k.p.Close(ctx, key, id)
}

func (k killablePool) Refuse(ctx context.Context, key string, d time.Duration, r escrow.Refusal) error {
	if k.dead.Load() {
		return ErrKilled
	}
	return k.p.Refuse(ctx, key, d, r)
}

func (k killablePool) Lock(ctx context.Context, key, owner string, ttl time.Duration) (bool, error) {
	if k.dead.Load() {
		return false, ErrKilled
	}
	return k.p.Lock(ctx, key, owner, ttl)
}

func (k killablePool) Unlock(ctx context.Context, key, owner string) error {
	if k.dead.Load() {
		return ErrKilled
	}
	return k.p.Unlock(ctx, key, owner)
}
