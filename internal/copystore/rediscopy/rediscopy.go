// Package rediscopy keeps the copy logs of copy-limited resources in Redis,
// so that every charon process sharing the Redis enforces the same copy
// limits (SPEC §4). It implements copystore.Store.
//
// Each resource's copy log is one key, <prefix>c{<resource>}, holding the
// copylog.State encoded by copylog's MarshalBinary. An operation is an
// optimistic transaction: WATCH the key, read it, run the copylog operation
// in Go at now (after reaping what lapsed), and write the result back in
// MULTI/EXEC; when another process changed the key meanwhile, EXEC fails and
// the operation runs again on the new state. So the rules are exactly
// copylog's, written once. The cost is four round trips per operation (five
// with the Redis clock) instead of one: a copy operation is rarer than a
// rate decision, and this is the price of not keeping a second copy of
// copylog in Lua.
//
// Time: with ClockRedis (the default) leases are measured by the Redis
// master's TIME, read in the transaction, so processes with skewed clocks
// agree; ClockCaller uses the now passed to each operation (tests).
//
// Every key has a TTL: 30 days after the latest lease, transfer ttl or
// reservation record in it, so the fencing token of a resource outlives its
// holds. A failure of Redis (network, timeout, too many conflicts) wraps
// copystore.ErrUnavailable and nothing falls back to local state.
package rediscopy

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/charonlimit/charon/copylog"
	"github.com/charonlimit/charon/internal/copystore"
	"github.com/charonlimit/charon/internal/store/redisstore"
)

// DefaultKeyPrefix starts every key unless Options.KeyPrefix says otherwise.
const DefaultKeyPrefix = "charon:"

// keep is how long a copy log outlives its latest expiry (its fencing token).
const keep = 30 * 24 * time.Hour

// maxAttempts bounds the optimistic retries of one operation.
const maxAttempts = 100

// ErrClosed is returned by every operation after Close.
var ErrClosed = fmt.Errorf("rediscopy: closed: %w", copystore.ErrUnavailable)

// Options configure a Store. The zero value uses the Redis clock and the
// default key prefix.
type Options struct {
	// KeyPrefix starts every key (default DefaultKeyPrefix); it must not
	// contain braces.
	KeyPrefix string
	// Clock: redisstore.ClockRedis (default) or redisstore.ClockCaller.
	Clock redisstore.Clock
}

// Store is a copystore.Store in Redis. Safe for concurrent use.
type Store struct {
	c      redis.UniversalClient
	prefix string
	clock  redisstore.Clock
	closed chan struct{}
}

// New returns a Store on client c, which the caller keeps and closes (a
// *redis.ClusterClient for a Cluster).
func New(c redis.UniversalClient, opts Options) *Store {
	p := opts.KeyPrefix
	if p == "" {
		p = DefaultKeyPrefix
	}
	return &Store{c: c, prefix: p, clock: opts.Clock, closed: make(chan struct{})}
}

// Close makes every later operation fail with ErrClosed. Closing twice is
// harmless. The client stays open (it is the caller's).
func (s *Store) Close() error {
	select {
	case <-s.closed:
	default:
		close(s.closed)
	}
	return nil
}

func (s *Store) key(resource string) string { return s.prefix + "c{" + resource + "}" }

// do runs op on the resource's copy log atomically and writes the result.
func (s *Store) do(ctx context.Context, now time.Time, resource string, op func(st *copylog.State, now time.Time) error) error {
	select {
	case <-s.closed:
		return ErrClosed
	default:
	}
	key := s.key(resource)
	var opErr error
	txf := func(tx *redis.Tx) error {
		at := now
		if s.clock == redisstore.ClockRedis {
			t, err := tx.Time(ctx).Result()
			if err != nil {
				return err
			}
			at = t
		}
		var st copylog.State
		b, err := tx.Get(ctx, key).Bytes()
		switch {
		case errors.Is(err, redis.Nil):
		case err != nil:
			return err
		default:
			if err := st.UnmarshalBinary(b); err != nil {
				return err
			}
		}
		opErr = op(&st, at)
		out, err := st.MarshalBinary()
		if err != nil {
			return err
		}
		ttl := keep
		if last := st.LastExpiry(); !last.IsZero() && last.After(at) {
			ttl += last.Sub(at)
		}
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, key, out, ttl)
			return nil
		})
		return err
	}
	for attempt := 0; attempt < maxAttempts; attempt++ {
		err := s.c.Watch(ctx, txf, key)
		if errors.Is(err, redis.TxFailedErr) {
			continue
		}
		if err != nil {
			return fmt.Errorf("%w: %s: %v", copystore.ErrUnavailable, resource, err)
		}
		return opErr
	}
	return fmt.Errorf("%w: %s: %d conflicting transactions in a row", copystore.ErrUnavailable, resource, maxAttempts)
}

// Reserve runs copylog.Reserve on resource.
func (s *Store) Reserve(ctx context.Context, now time.Time, resource string, cfg *copylog.Config, r copylog.ReserveRequest) (res copylog.Reservation, err error) {
	err = s.do(ctx, now, resource, func(st *copylog.State, now time.Time) (e error) {
		res, e = copylog.Reserve(cfg, st, now, r)
		return e
	})
	return res, err
}

// Release runs copylog.Release on resource.
func (s *Store) Release(ctx context.Context, now time.Time, resource, holdID string, copies int64) (res copylog.ReleaseResult, err error) {
	err = s.do(ctx, now, resource, func(st *copylog.State, now time.Time) (e error) {
		res, e = copylog.Release(st, now, holdID, copies)
		return e
	})
	return res, err
}

// Transfer runs copylog.Transfer on resource.
func (s *Store) Transfer(ctx context.Context, now time.Time, resource, holdID string, copies int64, ttl time.Duration, transferID string) (res copylog.TransferResult, err error) {
	err = s.do(ctx, now, resource, func(st *copylog.State, now time.Time) (e error) {
		res, e = copylog.Transfer(st, now, holdID, copies, ttl, transferID)
		return e
	})
	return res, err
}

// Seize runs copylog.Seize on resource.
func (s *Store) Seize(ctx context.Context, now time.Time, resource, transferID, holdID, session string, lease time.Duration) (res copylog.SeizeResult, err error) {
	err = s.do(ctx, now, resource, func(st *copylog.State, now time.Time) (e error) {
		res, e = copylog.Seize(st, now, transferID, holdID, session, lease)
		return e
	})
	return res, err
}

// KeepAlive runs copylog.KeepAlive on resource.
func (s *Store) KeepAlive(ctx context.Context, now time.Time, resource, session, holdID string, lease time.Duration) (res copylog.KeepAliveResult, err error) {
	err = s.do(ctx, now, resource, func(st *copylog.State, now time.Time) (e error) {
		res, e = copylog.KeepAlive(st, now, session, holdID, lease)
		return e
	})
	return res, err
}

// ReleaseSession runs copylog.ReleaseSession on resource.
func (s *Store) ReleaseSession(ctx context.Context, now time.Time, resource, session string) (res copylog.SessionResult, err error) {
	err = s.do(ctx, now, resource, func(st *copylog.State, now time.Time) (e error) {
		res, e = copylog.ReleaseSession(st, now, session)
		return e
	})
	return res, err
}

// Reap expires the lapsed holds and transfers of every resource in the
// Redis (on every master of a Cluster).
func (s *Store) Reap(ctx context.Context, now time.Time) error {
	select {
	case <-s.closed:
		return ErrClosed
	default:
	}
	reapNode := func(ctx context.Context, c redis.UniversalClient) error {
		it := c.Scan(ctx, 0, s.prefix+"c{*", 256).Iterator()
		for it.Next(ctx) {
			k := it.Val()
			res := k[len(s.prefix)+2 : len(k)-1]
			if err := s.do(ctx, now, res, func(st *copylog.State, now time.Time) error {
				_, err := copylog.Expire(st, now)
				return err
			}); err != nil {
				return err
			}
		}
		if err := it.Err(); err != nil {
			return fmt.Errorf("%w: scan: %v", copystore.ErrUnavailable, err)
		}
		return nil
	}
	if cc, ok := s.c.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return reapNode(ctx, c) })
	}
	return reapNode(ctx, s.c)
}

var _ copystore.Store = (*Store)(nil)
