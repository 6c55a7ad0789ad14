package redisbackend

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/charonlimit/charon/internal/store/redisstore"
)

// lateCollector exports the Redis store's LateGrants as
// charon_redis_late_grants_total, by outcome, and its Undone as
// charon_redis_slot_undos_total.
type lateCollector struct {
	late   func() (given, failed uint64)
	lost   func() uint64
	undone func() (given, failed uint64)
}

func newLateCollector(s *redisstore.Store) lateCollector {
	return lateCollector{late: s.LateGrants, lost: s.LateLost, undone: s.Undone}
}

var (
	lateDesc = prometheus.NewDesc("charon_redis_late_grants_total",
		"Calls Redis applied after their callers gave up (the failure mode decided for them), by what became of their grants: given_back (undone where they went, or refunded), or refund_failed; reply_lost counts those calls whose reply never came (applied or not, nothing was given back).",
		[]string{"outcome"}, nil)
	undoDesc = prometheus.NewDesc("charon_redis_slot_undos_total",
		"Slots of Redis Cluster calls spanning slots that had granted when another slot rejected (or failed), by what became of their grants: given_back, or undo_failed (the hits stay counted until they leave their window: only ever less granted).",
		[]string{"outcome"}, nil)
)

func (c lateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- lateDesc
	ch <- undoDesc
}

func (c lateCollector) Collect(ch chan<- prometheus.Metric) {
	given, failed := c.late()
	ch <- prometheus.MustNewConstMetric(lateDesc, prometheus.CounterValue, float64(given), "given_back")
	ch <- prometheus.MustNewConstMetric(lateDesc, prometheus.CounterValue, float64(failed), "refund_failed")
	ch <- prometheus.MustNewConstMetric(lateDesc, prometheus.CounterValue, float64(c.lost()), "reply_lost")
	given, failed = c.undone()
	ch <- prometheus.MustNewConstMetric(undoDesc, prometheus.CounterValue, float64(given), "given_back")
	ch <- prometheus.MustNewConstMetric(undoDesc, prometheus.CounterValue, float64(failed), "undo_failed")
}
