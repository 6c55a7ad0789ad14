package main

import (
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/charonlimit/charon/internal/copystore"
	"github.com/charonlimit/charon/internal/copystore/memcopy"
	"github.com/charonlimit/charon/server"
)

// copySweepInterval is how often the copy store's reaper releases lapsed
// holds and transfers of resources nobody touches (operations reap their
// own resource anyway).
const copySweepInterval = time.Second

// openCopies opens the copy store of copy-limited resources. --store memory
// (and, until the Redis copy store is wired here, --store redis) keeps the
// copies in this process: they are not shared with other servers.
func openCopies(c serveConfig, log *slog.Logger) copystore.Store {
	if c.Store == "redis" {
		log.Warn("copy-limited resources are kept in memory: they are not shared between servers")
	}
	return memcopy.New(memcopy.Options{SweepInterval: copySweepInterval})
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
