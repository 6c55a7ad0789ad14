package main

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/charonlimit/charon/internal/copystore"
	"github.com/charonlimit/charon/internal/copystore/memcopy"
	"github.com/charonlimit/charon/internal/copystore/rediscopy"
	"github.com/charonlimit/charon/internal/store/redisstore"
	"github.com/charonlimit/charon/server"
)

// copySweepInterval is how often the copy store's reaper releases lapsed
// holds and transfers of resources nobody touches (operations reap their
// own resource anyway).
const copySweepInterval = time.Second

// openCopies opens the copy store of copy-limited resources: in this process
// with --store memory, in the shared Redis with --store redis (never with a
// local fallback: a copy operation Redis cannot answer fails UNAVAILABLE).
func openCopies(c serveConfig, log *slog.Logger) (copystore.Store, error) {
	if c.Store != "redis" {
		return memcopy.New(memcopy.Options{SweepInterval: copySweepInterval}), nil
	}
	var cl redis.UniversalClient
	if strings.HasPrefix(c.RedisURL, "unix://") {
		o, err := redis.ParseURL(c.RedisURL)
		if err != nil {
			return nil, err
		}
		if c.RedisUsername != "" {
			o.Username = c.RedisUsername
		}
		if c.RedisPassword != "" {
			o.Password = c.RedisPassword
		}
		o.ContextTimeoutEnabled = true
		cl = redis.NewClient(o)
	} else {
		u, err := redisstore.ClientOptions(redisOptions(c))
		if err != nil {
			return nil, err
		}
		cl = redis.NewUniversalClient(u)
	}
	r := &redisCopies{Store: rediscopy.New(cl, rediscopy.Options{}), c: cl, stop: make(chan struct{}), done: make(chan struct{})}
	go r.reaper(log)
	log.Info("copy store", "kind", "redis")
	return r, nil
}

// redisCopies is the Redis copy store of serve: it owns its client and
// reaps lapsed holds of every resource every copySweepInterval, so holds of a
// dead process are released without any coordinator. Each sweep's view of
// the Redis (what it reaped, what is held) feeds the copy store's metrics.
type redisCopies struct {
	*rediscopy.Store
	c          redis.UniversalClient
	stop, done chan struct{}
	closeOnce  sync.Once

	mu sync.Mutex
	st redisCopyStats
}

// redisCopyStats: the Redis copy logs as of the last sweep, and what this
// process's sweeps reaped.
type redisCopyStats struct {
	Live                         rediscopy.Live
	ReapedHolds, ReapedTransfers int64
	Sweeps                       int64
}

// sweep runs one sweep and records its stats.
func (r *redisCopies) sweep(ctx context.Context, now time.Time) error {
	sw, err := r.Sweep(ctx, now)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.st.ReapedHolds += int64(sw.Reaped.Holds)
	r.st.ReapedTransfers += int64(sw.Reaped.Transfers)
	if err == nil {
		r.st.Live = sw.Live
		r.st.Sweeps++
	}
	return err
}

// Stats returns the last sweep's view and this process's reaping totals.
func (r *redisCopies) Stats() redisCopyStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.st
}

func (r *redisCopies) reaper(log *slog.Logger) {
	defer close(r.done)
	t := time.NewTicker(copySweepInterval)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), copySweepInterval)
			if err := r.sweep(ctx, time.Now()); err != nil {
				log.Debug("copy reaper", "err", err.Error())
			}
			cancel()
		}
	}
}

func (r *redisCopies) Close() error {
	var err error
	r.closeOnce.Do(func() {
		close(r.stop)
		<-r.done
		err = errors.Join(r.Store.Close(), r.c.Close())
	})
	return err
}

// charonOptions configures the charon.v1 service over copies: the holds
// gauge and the store's expiry counters when the store reports them.
func charonOptions(copies copystore.Store, m *server.Metrics) server.CharonOptions {
	var o server.CharonOptions
	switch cs := copies.(type) {
	case *memcopy.Store:
		o.Holds = func() float64 { return float64(cs.Stats().Copies) }
		registerMemcopyStats(m, cs)
	case *redisCopies:
		o.Holds = func() float64 { return float64(cs.Stats().Live.Copies) }
		registerRedisCopyStats(m, cs)
	}
	return o
}

// registerRedisCopyStats exports the Redis copy store's view as of the
// reaper's last sweep (every process sharing the Redis sees the same
// holds) and what this process's sweeps reaped.
func registerRedisCopyStats(m *server.Metrics, r *redisCopies) {
	registerCopystore(m, r.Stats,
		copystoreMetric[redisCopyStats]{"holds", "Live holds in the Redis copy logs, as of the last sweep.", false,
			func(s redisCopyStats) float64 { return float64(s.Live.Holds) }},
		copystoreMetric[redisCopyStats]{"transfers", "Staged transfers in the Redis copy logs, as of the last sweep.", false,
			func(s redisCopyStats) float64 { return float64(s.Live.Transfers) }},
		copystoreMetric[redisCopyStats]{"reaped_holds_total", "Holds whose lease lapsed released by this process's periodic sweeps.", true,
			func(s redisCopyStats) float64 { return float64(s.ReapedHolds) }},
		copystoreMetric[redisCopyStats]{"reaped_transfers_total", "Unseized transfers released by this process's periodic sweeps.", true,
			func(s redisCopyStats) float64 { return float64(s.ReapedTransfers) }},
		copystoreMetric[redisCopyStats]{"sweeps_total", "Completed sweeps of every copy log in the Redis.", true,
			func(s redisCopyStats) float64 { return float64(s.Sweeps) }},
	)
}

// registerMemcopyStats exports the memory copy store's gauges and counters.
func registerMemcopyStats(m *server.Metrics, mc *memcopy.Store) {
	registerCopystore(m, mc.Stats,
		copystoreMetric[memcopy.Stats]{"holds", "Live holds in the copy store.", false,
			func(s memcopy.Stats) float64 { return float64(s.Holds) }},
		copystoreMetric[memcopy.Stats]{"transfers", "Staged transfers in the copy store.", false,
			func(s memcopy.Stats) float64 { return float64(s.Transfers) }},
		copystoreMetric[memcopy.Stats]{"lease_expiries_total", "Holds released because their lease lapsed.", true,
			func(s memcopy.Stats) float64 { return float64(s.LeaseExpiries) }},
		copystoreMetric[memcopy.Stats]{"reaped_holds_total", "Holds released by the periodic reaper (a subset of lease expiries).", true,
			func(s memcopy.Stats) float64 { return float64(s.ReapedHolds) }},
		copystoreMetric[memcopy.Stats]{"session_holds_total", "Holds released because their session ended.", true,
			func(s memcopy.Stats) float64 { return float64(s.SessionHolds) }},
	)
}

// copystoreMetric is a charon_copystore_ gauge or counter read from a
// store's stats S.
type copystoreMetric[S any] struct {
	name, help string
	counter    bool
	value      func(S) float64
}

// registerCopystore registers ms, each reading stats when scraped.
func registerCopystore[S any](m *server.Metrics, stats func() S, ms ...copystoreMetric[S]) {
	for _, c := range ms {
		f := func() float64 { return c.value(stats()) }
		if c.counter {
			m.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
				Namespace: "charon", Subsystem: "copystore", Name: c.name, Help: c.help}, f))
		} else {
			m.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Namespace: "charon", Subsystem: "copystore", Name: c.name, Help: c.help}, f))
		}
	}
}
