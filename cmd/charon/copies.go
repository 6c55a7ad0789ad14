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
// dead process are released without any coordinator.
type redisCopies struct {
	*rediscopy.Store
	c          redis.UniversalClient
	stop, done chan struct{}
	closeOnce  sync.Once
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
			if err := r.Reap(ctx, time.Now()); err != nil {
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
	if mc, ok := copies.(*memcopy.Store); ok {
		o.Holds = func() float64 { return float64(mc.Stats().Copies) }
		registerMemcopyStats(m, mc)
	}
	return o
}

// registerMemcopyStats exports the memory copy store's gauges and counters.
func registerMemcopyStats(m *server.Metrics, mc *memcopy.Store) {
	gauge := func(name, help string, f func(memcopy.Stats) float64) {
		m.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "charon", Subsystem: "copystore", Name: name, Help: help,
		}, func() float64 { return f(mc.Stats()) }))
	}
	counter := func(name, help string, f func(memcopy.Stats) float64) {
		m.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "charon", Subsystem: "copystore", Name: name, Help: help,
		}, func() float64 { return f(mc.Stats()) }))
	}
	gauge("holds", "Live holds in the copy store.", func(s memcopy.Stats) float64 { return float64(s.Holds) })
	gauge("transfers", "Staged transfers in the copy store.", func(s memcopy.Stats) float64 { return float64(s.Transfers) })
	counter("lease_expiries_total", "Holds released because their lease lapsed.", func(s memcopy.Stats) float64 { return float64(s.LeaseExpiries) })
	counter("reaped_holds_total", "Holds released by the periodic reaper (a subset of lease expiries).", func(s memcopy.Stats) float64 { return float64(s.ReapedHolds) })
	counter("session_holds_total", "Holds released because their session ended.", func(s memcopy.Stats) float64 { return float64(s.SessionHolds) })
}
