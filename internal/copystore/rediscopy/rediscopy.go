// Package rediscopy keeps the copy logs of copy-limited resources in Redis,
// so that every charon process sharing the Redis enforces the same copy
// limits (SPEC §4). It implements copystore.Store.
//
// Each resource's copy log is one key, <prefix>c{<resource>}, a cmsgpack
// string (its layout is described in copies.lua). Every operation is one
// FCALL of a Redis 7 function library (copies.lua, loaded by the store
// itself, again after a restart or failover that lost it) that decodes the
// copy log, reaps what lapsed, runs the operation, writes the log back and
// answers: one round trip, atomic per resource, on a single node or a
// Cluster (the braces make the key its own hash slot). The Lua code
// follows copylog's documented contract path by path; the argument checks
// are copylog's own, run in Go before the call, and the conformance suite
// (copystoretest) compares every answer with copylog's.
//
// Time: with ClockRedis (the default) leases are measured by the Redis
// master's TIME, read inside the function, so processes with skewed clocks
// agree; ClockCaller uses the now passed to each operation (tests).
//
// Every key has a TTL: 30 days after the latest lease, transfer ttl or
// reservation record in it, so the fencing token of a resource outlives its
// holds. A failure of Redis (network, timeout, a closed store) wraps
// copystore.ErrUnavailable and nothing falls back to local state.
package rediscopy

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/charonlimit/charon/copylog"
	"github.com/charonlimit/charon/internal/copystore"
	"github.com/charonlimit/charon/internal/redisfunc"
)

// DefaultKeyPrefix starts every key unless Options.KeyPrefix says otherwise.
const DefaultKeyPrefix = "charon:"

// ErrClosed is returned by every operation after Close.
var ErrClosed = fmt.Errorf("rediscopy: closed: %w", copystore.ErrUnavailable)

// Options configure a Store. The zero value uses the Redis clock and the
// default key prefix.
type Options struct {
	// KeyPrefix starts every key (default DefaultKeyPrefix); it must not
	// contain braces.
	KeyPrefix string
	// Clock: redisfunc.ClockRedis (default) or redisfunc.ClockCaller.
	Clock redisfunc.Clock
}

// Store is a copystore.Store in Redis. Safe for concurrent use.
type Store struct {
	c      redis.UniversalClient
	prefix string
	clock  redisfunc.Clock
	closed chan struct{}
	// indexFailed counts index writes that failed twice (IndexFailed).
	indexFailed atomic.Uint64
}

// IndexFailed returns how many operations that may leave holds could not
// index their resource for the reaper (the write failed, and again when
// retried): such a resource's lapsed holds are released by its next
// operation, not by the sweeps, until an operation indexes it.
func (s *Store) IndexFailed() uint64 { return s.indexFailed.Load() }

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

// indexKey is the reaper's index: a sorted set of the resources whose
// copy logs may hold holds or transfers, each scored by a counter that every
// reserve, seize and transfer on it increments. A sweep visits its members
// only, and removes a member whose log it found empty unless an operation
// indexed it again meanwhile (the counter moved). One key, so on a Cluster
// it lives on one master.
func (s *Store) indexKey() string { return s.prefix + "copies-index" }

// indexTTL is the index's life after its last update: as long as a copy log
// outlives its last expiry.
const indexTTL = 30 * 24 * time.Hour

// unindex removes resource from the index if its counter is still score.
var unindex = redis.NewScript(`
if redis.call('ZSCORE', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('ZREM', KEYS[1], ARGV[1])
end
return 0`)

// Reserve runs copylog.Reserve on resource: one FCALL.
func (s *Store) Reserve(ctx context.Context, now time.Time, resource string, cfg *copylog.Config, r copylog.ReserveRequest) (copylog.Reservation, error) {
	return reserveFCall(s, ctx, now, resource, cfg, r)
}

// Release runs copylog.Release on resource: one FCALL.
func (s *Store) Release(ctx context.Context, now time.Time, resource, holdID string, copies int64) (copylog.ReleaseResult, error) {
	return releaseFCall(s, ctx, now, resource, holdID, copies)
}

// Transfer runs copylog.Transfer on resource: one FCALL.
func (s *Store) Transfer(ctx context.Context, now time.Time, resource, holdID string, copies int64, ttl time.Duration, transferID string) (copylog.TransferResult, error) {
	return transferFCall(s, ctx, now, resource, holdID, copies, ttl, transferID)
}

// Seize runs copylog.Seize on resource: one FCALL.
func (s *Store) Seize(ctx context.Context, now time.Time, resource, transferID, holdID, session string, lease time.Duration) (copylog.SeizeResult, error) {
	return seizeFCall(s, ctx, now, resource, transferID, holdID, session, lease)
}

// KeepAlive runs copylog.KeepAlive on resource: one FCALL.
func (s *Store) KeepAlive(ctx context.Context, now time.Time, resource, session, holdID string, lease time.Duration) (copylog.KeepAliveResult, error) {
	return keepAliveFCall(s, ctx, now, resource, session, holdID, lease)
}

// ReleaseSession runs copylog.ReleaseSession on resource: one FCALL.
func (s *Store) ReleaseSession(ctx context.Context, now time.Time, resource, session string) (copylog.SessionResult, error) {
	return releaseSessionFCall(s, ctx, now, resource, session)
}

// Reap expires the lapsed holds and transfers of the indexed resources
// (see indexKey): the logs that reserves, seizes and transfers left holds
// or transfers in.
func (s *Store) Reap(ctx context.Context, now time.Time) error {
	_, err := s.Sweep(ctx, now)
	return err
}

// Live is what copy logs hold: holds, staged transfers, and the copies of
// both.
type Live struct {
	Holds, Transfers int
	Copies           int64
}

// SweepStats is what a Sweep released and what was left.
type SweepStats struct {
	Reaped copylog.Reaped
	Live   Live
	Logs   int // copy logs visited
}

// Sweep is Reap, reporting what it released and what the indexed copy
// logs hold afterwards: a view of all the processes sharing the Redis, as of
// the sweep. It visits the resources of the index (see indexKey), never the
// keyspace. On an error the stats cover the logs visited before it.
func (s *Store) Sweep(ctx context.Context, now time.Time) (SweepStats, error) {
	var st SweepStats
	select {
	case <-s.closed:
		return st, ErrClosed
	default:
	}
	it := s.c.ZScan(ctx, s.indexKey(), 0, "", 256).Iterator()
	for it.Next(ctx) {
		res := it.Val()
		if !it.Next(ctx) {
			break
		}
		score := it.Val()
		r, live, err := expireFCall(s, ctx, now, res)
		if err != nil {
			return st, err
		}
		st.Logs++
		st.Reaped.Holds += r.Holds
		st.Reaped.Transfers += r.Transfers
		st.Reaped.Copies += r.Copies
		st.Live.Holds += live.Holds
		st.Live.Transfers += live.Transfers
		st.Live.Copies += live.Copies
		if live.Holds == 0 && live.Transfers == 0 {
			if err := unindex.Run(ctx, s.c, []string{s.indexKey()}, res, score).Err(); err != nil {
				return st, fmt.Errorf("%w: index: %v", copystore.ErrUnavailable, err)
			}
		}
	}
	if err := it.Err(); err != nil {
		return st, fmt.Errorf("%w: index: %v", copystore.ErrUnavailable, err)
	}
	return st, nil
}

var _ copystore.Store = (*Store)(nil)
