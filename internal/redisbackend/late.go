package redisbackend

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/charonlimit/charon/internal/store/redisstore"
)

// lateCollector exports the Redis store's LateGrants as
// charon_redis_late_grants_total, by outcome.
type lateCollector struct{ s *redisstore.Store }

var lateDesc = prometheus.NewDesc("charon_redis_late_grants_total",
	"Calls Redis applied after their callers gave up (the failure mode decided for them), by what became of their grants: given_back (undone where they went, or refunded), or refund_failed; reply_lost counts those calls whose reply never came (applied or not, nothing was given back).",
	[]string{"outcome"}, nil)

func (c lateCollector) Describe(ch chan<- *prometheus.Desc) { ch <- lateDesc }

func (c lateCollector) Collect(ch chan<- prometheus.Metric) {
	given, failed := c.s.LateGrants()
	ch <- prometheus.MustNewConstMetric(lateDesc, prometheus.CounterValue, float64(given), "given_back")
	ch <- prometheus.MustNewConstMetric(lateDesc, prometheus.CounterValue, float64(failed), "refund_failed")
	ch <- prometheus.MustNewConstMetric(lateDesc, prometheus.CounterValue, float64(c.s.LateLost()), "reply_lost")
}
