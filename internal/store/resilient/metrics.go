package resilient

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/charonlimit/charon/internal/collect"
)

// NewCollector exports the counters of a resilient store (the Redis store
// behind its deadline, breaker, failure mode and over-limit cache), read from
// stats at every scrape:
//
//	charon_store_calls_total{path}             decisions by path: remote, cached, local, open, closed, unavailable
//	charon_store_remote_errors_total           failed remote calls (timeouts included)
//	charon_store_remote_timeouts_total         remote calls that hit their deadline
//	charon_store_remote_slow_total             of those, timeouts while Redis answered other calls (not counted by the breaker)
//	charon_store_not_sent_total                calls whose deadline passed while queued for Redis in this process
//	charon_store_not_sent_stuck_total          of those, calls queued behind calls Redis had not answered (counted as timeouts)
//	charon_store_breaker_state                 0 closed, 1 open
//	charon_store_breaker_opens_total           times the circuit breaker opened
//	charon_store_overlimit_cache_hits_total    decisions answered by the over-limit cache
//	charon_store_overlimit_cache_misses_total  decisions without refunds it could not answer
//	charon_store_overlimit_cache_entries       cached rejections now
//	charon_store_overlimit_cache_evictions_total
//	charon_store_debt_deferred_total           cached refusals of post-paid pairs in debt whose hits were summed to send later
//	charon_store_debt_flushes_total            remote calls that sent such sums (one per pair per flush)
//	charon_store_debt_flush_errors_total       of those, calls that failed
//	charon_store_replicas                      replicas sharing the remote as last counted (0: never); the local failure mode's divisor
//	charon_store_master_breaker_state{master}  with shards (a Redis Cluster), each master's breaker: 0 closed, 1 open
//	charon_store_master_breaker_opens_total{master}
//	charon_store_master_failures_total{master} remote calls on the master that failed, counted by its breaker
//
// The cache's hit ratio is hits / (hits + misses). stats (Store.Stats)
// must be safe for concurrent use; register one collector per registry.
func NewCollector(stats func() Stats) prometheus.Collector {
	counter := func(name, help string, v func(Stats) uint64) collect.Metric[Stats] {
		return collect.Metric[Stats]{Name: name, Help: help, Counter: true, Value: func(s Stats) float64 { return float64(v(s)) }}
	}
	return &storeCollector{stats: stats, Collector: collect.Collector("charon", "store", stats,
		counter("remote_errors_total", "Remote store calls that failed, timeouts included.", func(s Stats) uint64 { return s.RemoteErrors }),
		counter("remote_timeouts_total", "Remote store calls that hit their deadline (the caller's less a margin, or the store timeout).", func(s Stats) uint64 { return s.Timeouts }),
		counter("remote_slow_total", "Remote store timeouts while the remote answered other calls: slow, not down; not counted by the breaker.", func(s Stats) uint64 { return s.Slow }),
		counter("not_sent_total", "Store calls whose deadline passed while queued in this process, before reaching the remote; answered by the failure mode.", func(s Stats) uint64 { return s.NotSent }),
		counter("not_sent_stuck_total", "Of the calls not sent, those queued behind calls the remote had not answered: counted as timeouts, and by the breaker.", func(s Stats) uint64 { return s.Stuck }),
		collect.Metric[Stats]{Name: "breaker_state", Help: "Circuit breaker in front of the remote store: 0 closed, 1 open.",
			Value: func(s Stats) float64 { return float64(s.Breaker) }},
		counter("breaker_opens_total", "Times the circuit breaker in front of the remote store opened.", func(s Stats) uint64 { return s.BreakerOpens }),
		counter("overlimit_cache_hits_total", "Decisions answered by the local over-limit cache without a remote call.", func(s Stats) uint64 { return s.CacheHits }),
		counter("overlimit_cache_misses_total", "Decisions without refunds that the over-limit cache could not answer.", func(s Stats) uint64 { return s.CacheMisses }),
		collect.Metric[Stats]{Name: "overlimit_cache_entries", Help: "Rejected pairs held by the over-limit cache.",
			Value: func(s Stats) float64 { return float64(s.CacheSize) }},
		counter("overlimit_cache_evictions_total", "Over-limit cache entries evicted by its size bound.", func(s Stats) uint64 { return s.CacheEvictions }),
		counter("debt_deferred_total", "Decisions of post-paid pairs in debt refused from the over-limit cache, whose hits were summed to be sent later.", func(s Stats) uint64 { return s.DebtDeferred }),
		counter("debt_flushes_total", "Remote calls that sent the summed refused hits of a post-paid pair in debt (one per pair per flush).", func(s Stats) uint64 { return s.DebtFlushes }),
		counter("debt_flush_errors_total", "Remote calls sending summed refused hits that failed (those not sent are sent with the next flush).", func(s Stats) uint64 { return s.DebtFlushErrors }),
		collect.Metric[Stats]{Name: "replicas", Help: "Replicas sharing the remote store, this one included, as last counted while it answered (0: never counted); the local failure mode divides every limit by it.",
			Value: func(s Stats) float64 { return float64(s.Replicas) }},
	)}
}

var (
	storeCallsDesc = prometheus.NewDesc("charon_store_calls_total",
		"Store decisions by the path that answered them: remote, cached (over-limit cache), or the failure mode (local, open, closed, unavailable).",
		[]string{"path"}, nil)
	masterStateDesc = prometheus.NewDesc("charon_store_master_breaker_state",
		"The circuit breaker of each Redis Cluster master (by address; its slots' calls answer to it): 0 closed, 1 open.",
		[]string{"master"}, nil)
	masterOpensDesc = prometheus.NewDesc("charon_store_master_breaker_opens_total",
		"Times the circuit breaker of each Redis Cluster master opened.",
		[]string{"master"}, nil)
	masterFailuresDesc = prometheus.NewDesc("charon_store_master_failures_total",
		"Redis calls on each Cluster master that failed and were counted by its breaker.",
		[]string{"master"}, nil)
)

// storeCollector adds the decisions by path, a counter with a label (which
// collect has not), to the collector of the other stats.
type storeCollector struct {
	prometheus.Collector
	stats func() Stats
}

func (c *storeCollector) Describe(ch chan<- *prometheus.Desc) {
	c.Collector.Describe(ch)
	ch <- storeCallsDesc
	ch <- masterStateDesc
	ch <- masterOpensDesc
	ch <- masterFailuresDesc
}

func (c *storeCollector) Collect(ch chan<- prometheus.Metric) {
	c.Collector.Collect(ch)
	st := c.stats()
	for _, p := range []struct {
		path  string
		calls uint64
	}{{"remote", st.Remote}, {"cached", st.Cached}, {"local", st.Local}, {"open", st.Open}, {"closed", st.Closed}, {"unavailable", st.Unavailable}} {
		ch <- prometheus.MustNewConstMetric(storeCallsDesc, prometheus.CounterValue, float64(p.calls), p.path)
	}
	for _, sh := range st.Shards {
		ch <- prometheus.MustNewConstMetric(masterStateDesc, prometheus.GaugeValue, float64(sh.Breaker), sh.Name)
		ch <- prometheus.MustNewConstMetric(masterOpensDesc, prometheus.CounterValue, float64(sh.BreakerOpens), sh.Name)
		ch <- prometheus.MustNewConstMetric(masterFailuresDesc, prometheus.CounterValue, float64(sh.Failures), sh.Name)
	}
}
