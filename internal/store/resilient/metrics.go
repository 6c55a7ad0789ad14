package resilient

import "github.com/prometheus/client_golang/prometheus"

// NewCollector exports the counters of a resilient store (the Redis store
// behind its deadline, breaker, failure mode and over-limit cache), read from
// stats at every scrape:
//
//	charon_store_calls_total{path}             decisions by path: remote, cached, local, open, closed, unavailable
//	charon_store_remote_errors_total           failed remote calls (timeouts included)
//	charon_store_remote_timeouts_total         remote calls that hit their deadline
//	charon_store_remote_slow_total             of those, timeouts while Redis answered other calls (not counted by the breaker)
//	charon_store_not_sent_total                calls whose deadline passed while queued for Redis in this process
//	charon_store_breaker_state                 0 closed, 1 open
//	charon_store_breaker_opens_total           times the circuit breaker opened
//	charon_store_overlimit_cache_hits_total    decisions answered by the over-limit cache
//	charon_store_overlimit_cache_misses_total  decisions without refunds it could not answer
//	charon_store_overlimit_cache_entries       cached rejections now
//	charon_store_overlimit_cache_evictions_total
//
// The cache's hit ratio is hits / (hits + misses). stats (Store.Stats)
// must be safe for concurrent use; register one collector per registry.
func NewCollector(stats func() Stats) prometheus.Collector {
	return &storeCollector{stats: stats}
}

var (
	storeCallsDesc = prometheus.NewDesc("charon_store_calls_total",
		"Store decisions by the path that answered them: remote, cached (over-limit cache), or the failure mode (local, open, closed, unavailable).",
		[]string{"path"}, nil)
	storeErrorsDesc = prometheus.NewDesc("charon_store_remote_errors_total",
		"Remote store calls that failed, timeouts included.", nil, nil)
	storeTimeoutsDesc = prometheus.NewDesc("charon_store_remote_timeouts_total",
		"Remote store calls that hit their deadline (the caller's less a margin, or the store timeout).", nil, nil)
	storeSlowDesc = prometheus.NewDesc("charon_store_remote_slow_total",
		"Remote store timeouts while the remote answered other calls: slow, not down; not counted by the breaker.", nil, nil)
	storeNotSentDesc = prometheus.NewDesc("charon_store_not_sent_total",
		"Store calls whose deadline passed while queued in this process, before reaching the remote; answered by the failure mode.", nil, nil)
	breakerStateDesc = prometheus.NewDesc("charon_store_breaker_state",
		"Circuit breaker in front of the remote store: 0 closed, 1 open.", nil, nil)
	breakerOpensDesc = prometheus.NewDesc("charon_store_breaker_opens_total",
		"Times the circuit breaker in front of the remote store opened.", nil, nil)
	cacheHitsDesc = prometheus.NewDesc("charon_store_overlimit_cache_hits_total",
		"Decisions answered by the local over-limit cache without a remote call.", nil, nil)
	cacheMissesDesc = prometheus.NewDesc("charon_store_overlimit_cache_misses_total",
		"Decisions without refunds that the over-limit cache could not answer.", nil, nil)
	cacheSizeDesc = prometheus.NewDesc("charon_store_overlimit_cache_entries",
		"Rejected pairs held by the over-limit cache.", nil, nil)
	cacheEvictionsDesc = prometheus.NewDesc("charon_store_overlimit_cache_evictions_total",
		"Over-limit cache entries evicted by its size bound.", nil, nil)
)

// storeCollector reads a resilient store's Stats at scrape time.
type storeCollector struct {
	stats func() Stats
}

func (c *storeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{storeCallsDesc, storeErrorsDesc, storeTimeoutsDesc, storeSlowDesc, storeNotSentDesc, breakerStateDesc,
		breakerOpensDesc, cacheHitsDesc, cacheMissesDesc, cacheSizeDesc, cacheEvictionsDesc} {
		ch <- d
	}
}

func (c *storeCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.stats()
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	counter(storeCallsDesc, st.Remote, "remote")
	counter(storeCallsDesc, st.Cached, "cached")
	counter(storeCallsDesc, st.Local, "local")
	counter(storeCallsDesc, st.Open, "open")
	counter(storeCallsDesc, st.Closed, "closed")
	counter(storeCallsDesc, st.Unavailable, "unavailable")
	counter(storeErrorsDesc, st.RemoteErrors)
	counter(storeTimeoutsDesc, st.Timeouts)
	counter(storeSlowDesc, st.Slow)
	counter(storeNotSentDesc, st.NotSent)
	ch <- prometheus.MustNewConstMetric(breakerStateDesc, prometheus.GaugeValue, float64(st.Breaker))
	counter(breakerOpensDesc, st.BreakerOpens)
	counter(cacheHitsDesc, st.CacheHits)
	counter(cacheMissesDesc, st.CacheMisses)
	ch <- prometheus.MustNewConstMetric(cacheSizeDesc, prometheus.GaugeValue, float64(st.CacheSize))
	counter(cacheEvictionsDesc, st.CacheEvictions)
}
