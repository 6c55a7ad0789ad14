package redisbackend

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/extra/redisotel/v9"
	"github.com/redis/go-redis/v9"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/collect"
	"github.com/charonlimit/charon/internal/copystore/rediscopy"
	"github.com/charonlimit/charon/internal/periodic"
	"github.com/charonlimit/charon/internal/redisconn"
	"github.com/charonlimit/charon/internal/sharestore/redisshare"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/internal/store/redisstore"
	"github.com/charonlimit/charon/internal/store/resilient"
)

// SweepInterval is how often the reaper releases lapsed holds and
// transfers of copy logs nobody touches (operations reap their own
// resource anyway).
const SweepInterval = time.Second

// Options configure a Backend. Conn.URL is required.
type Options struct {
	// Conn names the Redis deployment and how to connect to it (URL forms,
	// credentials, TLS, pool): see redisconn.Options.
	Conn redisconn.Options
	// Timeout, FailureMode and Local configure the rate-limit store's
	// resilient wrapper (Timeout, Mode, Local).
	Timeout     time.Duration
	FailureMode resilient.Mode
	Local       memstore.Options
	// Logger receives the breaker's transitions and the reaper's errors;
	// nil discards them.
	Logger *slog.Logger
	// Tracing traces every Redis call with OpenTelemetry's global tracer
	// provider.
	Tracing bool
	// PresenceInterval and PresenceTTL set how often Run counts the
	// processes sharing the Redis and how long one that stopped counting
	// still counts (0: the defaults PresenceInterval and PresenceTTL).
	PresenceInterval, PresenceTTL time.Duration
}

// Check validates o without connecting.
func Check(o Options) error {
	if o.Conn.URL == "" {
		return errors.New("redisbackend: no Redis URL")
	}
	return o.Conn.Check()
}

// On a Cluster the Redis store names the masters a call goes to, and the
// resilient wrapper keeps a breaker per master.
var _ resilient.Sharder = (*redisstore.Store)(nil)
var _ resilient.ShardReplier = (*redisstore.Store)(nil)

// Backend is the Redis state of one process: one client, the rate-limit
// store and the copy store on it. Create it with Open; Close it. Safe for
// concurrent use.
type Backend struct {
	client redis.UniversalClient
	store  *resilient.Store
	remote *redisstore.Store // behind store
	copies *Copies
	log    *slog.Logger
	wake   chan struct{} // breaker transitions
	// reaping: copy-limited resources are configured (SetTree).
	reaping atomic.Bool
	// presence counts the processes sharing the Redis every beatEvery.
	presence  *presence
	beatEvery time.Duration
	replicas  atomic.Int64 // the last count, for logging its changes

	closeOnce sync.Once
	closeErr  error
}

// Open opens the client (go-redis dials on first use) and builds the
// stores. A Redis that does not answer a first ping within a second is
// logged, not an error: the failure mode decides until it answers.
func Open(o Options) (*Backend, error) {
	if err := Check(o); err != nil {
		return nil, err
	}
	c, err := redisconn.Open(o.Conn)
	if err != nil {
		return nil, err
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if o.Tracing {
		if err := redisotel.InstrumentTracing(c); err != nil {
			c.Close()
			return nil, err
		}
	}
	rs, err := redisstore.NewWithClient(c, redisstore.Options{Cluster: o.Conn.Cluster})
	if err != nil {
		c.Close()
		return nil, err
	}
	b := &Backend{client: c, remote: rs, log: log, wake: make(chan struct{}, 1),
		presence: newPresence(c, cmp.Or(o.PresenceTTL, PresenceTTL)), beatEvery: cmp.Or(o.PresenceInterval, PresenceInterval)}
	b.store = resilient.New(rs, resilient.Options{
		Mode:    o.FailureMode,
		Timeout: o.Timeout,
		Local:   o.Local,
		OnBreakerChange: func(resilient.BreakerState) {
			select {
			case b.wake <- struct{}{}:
			default:
			}
		},
	})
	b.copies = &Copies{Store: rediscopy.New(c, rediscopy.Options{})}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := rs.Ping(ctx); err != nil {
		log.Warn("redis does not answer yet; deciding by the failure mode until it does",
			"failure_mode", o.FailureMode.String(), "err", err.Error())
	}
	return b, nil
}

// Store is the rate-limit store: Redis behind the failure mode.
func (b *Backend) Store() *resilient.Store { return b.store }

// Leaser is the Redis store itself, without the failure mode: escrow
// leases are taken from it, so that a lease is never reserved in this
// process's memory and given back to Redis.
func (b *Backend) Leaser() *redisstore.Store { return b.remote }

// Copies is the copy store (never with a local fallback: a copy operation
// Redis cannot answer fails UNAVAILABLE).
func (b *Backend) Copies() *Copies { return b.copies }

// Shares is the store of RLQS leases, on the same client: replicas on one
// Redis share each rule's budget.
func (b *Backend) Shares() *redisshare.Store { return redisshare.New(b.client) }

// Register registers both stores' collectors: charon_store_*,
// charon_redis_late_grants_total, charon_redis_slot_undos_total and
// charon_copystore_*.
func (b *Backend) Register(reg prometheus.Registerer) {
	reg.MustRegister(resilient.NewCollector(b.store.Stats), newLateCollector(b.remote), b.copies.Collector())
}

// SetTree is told every configuration put in force: it flushes the
// over-limit cache (answers of the old limits), and the reaper sweeps the
// copy logs only while the configuration has copy-limited resources.
func (b *Backend) SetTree(t *descriptors.Tree) {
	b.store.Flush()
	b.reaping.Store(t.HasCopies())
}

// Run keeps the backend healthy until ctx ends or the returned function
// is called (which waits for it to stop): it probes Redis every
// CoolOff/10 once the breaker's cool-off is over (PING, and the decide
// function loaded again if Redis lost it; a new probe does not wait for a
// ping still in flight, up to resilient.MaxProbes), which is how the
// breaker closes; it calls setServing with the store's Serving on every change
// (NOT_SERVING only in the unavailable mode while Redis is down) and logs
// breaker transitions; while the configuration has copy-limited
// resources (SetTree), it sweeps the copy logs every SweepInterval; and it
// counts the processes sharing the Redis at once and every
// PresenceInterval (presence.go), telling the store (SetReplicas) so that
// the local failure mode divides each limit among them. The returned
// function also removes this process from the count.
func (b *Backend) Run(ctx context.Context, setServing func(bool)) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var watcher sync.WaitGroup
	watcher.Go(func() { b.watch(ctx, setServing) })
	watcher.Go(func() { b.beat(ctx) })
	beats := periodic.Start(b.beatEvery, func() { b.beat(ctx) })
	reaper := periodic.Sweep(SweepInterval, nil, func(now time.Time) { b.reap(ctx, now) })
	context.AfterFunc(ctx, reaper.Stop)
	context.AfterFunc(ctx, beats.Stop)
	return func() {
		cancel()
		reaper.Stop()
		beats.Stop()
		watcher.Wait()
		leave, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := b.presence.leave(leave); err != nil {
			b.log.Debug("redis presence: leave", "err", err.Error())
		}
	}
}

// beat counts the processes sharing the Redis once (presence.beat) and
// tells the store; a failed count changes nothing, so that an outage
// keeps the count seen before it.
func (b *Backend) beat(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, b.beatEvery)
	defer cancel()
	n, err := b.presence.beat(ctx)
	if err != nil {
		b.log.Debug("redis presence: beat", "err", err.Error())
		return
	}
	b.store.SetReplicas(n)
	if was := b.replicas.Swap(int64(n)); was != int64(n) {
		b.log.Info("replicas sharing the redis store", "replicas", n, "was", was)
	}
}

func (b *Backend) watch(ctx context.Context, setServing func(bool)) {
	tick := time.NewTicker(resilient.DefaultCoolOff / 10) // Probe is a no-op until the cool-off ends
	defer tick.Stop()
	serving, breaker := true, resilient.BreakerClosed
	masters := map[string]resilient.BreakerState{}
	// Probes overlap: a ping lost in a black hole waits for its timeout
	// while the next tick's finds Redis back (resilient.MaxProbes at
	// once); a probe that closes the breaker wakes this loop.
	var probes sync.WaitGroup
	defer probes.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-b.wake:
		case <-tick.C:
			probes.Go(func() { _ = b.store.Probe(ctx) })
		}
		st := b.store.Stats()
		if len(st.Shards) > 0 {
			// A Cluster: each master's breaker on its own.
			for _, sh := range st.Shards {
				if was, ok := masters[sh.Name]; ok || sh.Breaker != resilient.BreakerClosed {
					if !ok || was != sh.Breaker {
						b.logBreaker(sh.Breaker, "master", sh.Name)
					}
				}
				masters[sh.Name] = sh.Breaker
			}
		} else if st.Breaker != breaker {
			b.logBreaker(st.Breaker)
		}
		breaker = st.Breaker
		if v := b.store.Serving(); v != serving {
			serving = v
			if setServing != nil {
				setServing(v)
			}
		}
	}
}

// logBreaker logs a breaker's transition to st, with attrs (the master's).
func (b *Backend) logBreaker(st resilient.BreakerState, attrs ...any) {
	attrs = append(attrs, "failure_mode", b.store.Mode().String())
	if st == resilient.BreakerOpen {
		b.log.Warn("redis store failing: circuit breaker open", attrs...)
		return
	}
	b.log.Info("redis store circuit breaker "+st.String(), attrs...)
}

// reap sweeps the copy logs once, if the configuration has copy-limited
// resources.
func (b *Backend) reap(ctx context.Context, now time.Time) {
	if !b.reaping.Load() || ctx.Err() != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, SweepInterval)
	defer cancel()
	if err := b.copies.Sweep(ctx, now); err != nil {
		b.log.Debug("copy reaper", "err", err.Error())
	}
}

// Close closes both stores and the client. It is idempotent.
func (b *Backend) Close() error {
	b.closeOnce.Do(func() {
		b.closeErr = errors.Join(b.store.Close(), b.copies.Store.Close(), b.client.Close())
	})
	return b.closeErr
}

// Copies is the Redis copy store with the view of its last sweep: what the
// copy logs hold (every process sharing the Redis sees the same) and what
// this process's sweeps reaped. Safe for concurrent use.
type Copies struct {
	*rediscopy.Store

	mu sync.Mutex
	st CopyStats
}

// CopyStats are the Redis copy logs as of the last sweep, and what this
// process's sweeps reaped.
type CopyStats struct {
	Live                         rediscopy.Live
	ReapedHolds, ReapedTransfers int64
	Sweeps                       int64
	// IndexFailed counts operations this process could not index for
	// the sweeps (rediscopy.Store.IndexFailed).
	IndexFailed uint64
}

// Sweep runs one sweep of the copy logs and records its view.
func (c *Copies) Sweep(ctx context.Context, now time.Time) error {
	sw, err := c.Store.Sweep(ctx, now)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.st.ReapedHolds += int64(sw.Reaped.Holds)
	c.st.ReapedTransfers += int64(sw.Reaped.Transfers)
	if err == nil {
		c.st.Live = sw.Live
		c.st.Sweeps++
	}
	if err != nil {
		return fmt.Errorf("redisbackend: sweep: %w", err)
	}
	return nil
}

// Stats returns the last sweep's view and this process's reaping totals.
func (c *Copies) Stats() CopyStats {
	c.mu.Lock()
	st := c.st
	c.mu.Unlock()
	st.IndexFailed = c.Store.IndexFailed()
	return st
}

// Collector exports the copy logs' view as of the reaper's last sweep and
// what this process's sweeps reaped, as charon_copystore_*.
func (c *Copies) Collector() prometheus.Collector {
	return collect.Collector("charon", "copystore", c.Stats,
		collect.Metric[CopyStats]{Name: "holds", Help: "Live holds in the Redis copy logs, as of the last sweep.",
			Value: func(s CopyStats) float64 { return float64(s.Live.Holds) }},
		collect.Metric[CopyStats]{Name: "transfers", Help: "Staged transfers in the Redis copy logs, as of the last sweep.",
			Value: func(s CopyStats) float64 { return float64(s.Live.Transfers) }},
		collect.Metric[CopyStats]{Name: "reaped_holds_total", Help: "Holds whose lease lapsed released by this process's periodic sweeps.", Counter: true,
			Value: func(s CopyStats) float64 { return float64(s.ReapedHolds) }},
		collect.Metric[CopyStats]{Name: "reaped_transfers_total", Help: "Unseized transfers released by this process's periodic sweeps.", Counter: true,
			Value: func(s CopyStats) float64 { return float64(s.ReapedTransfers) }},
		collect.Metric[CopyStats]{Name: "sweeps_total", Help: "Completed sweeps of the indexed copy logs in the Redis.", Counter: true,
			Value: func(s CopyStats) float64 { return float64(s.Sweeps) }},
		collect.Metric[CopyStats]{Name: "index_failed_total", Help: "Copy operations whose resource could not be indexed for the sweeps (twice): its lapsed holds wait for its next operation.", Counter: true,
			Value: func(s CopyStats) float64 { return float64(s.IndexFailed) }},
	)
}
