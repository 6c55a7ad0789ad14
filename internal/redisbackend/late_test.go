package redisbackend

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestLateCollector: the store's late grants, lost replies and Cluster
// undos, each outcome its own series.
func TestLateCollector(t *testing.T) {
	c := lateCollector{
		late:   func() (uint64, uint64) { return 5, 1 },
		lost:   func() uint64 { return 2 },
		undone: func() (uint64, uint64) { return 7, 3 },
	}
	want := `
# HELP charon_redis_late_grants_total Calls Redis applied after their callers gave up (the failure mode decided for them), by what became of their grants: given_back (undone where they went, or refunded), or refund_failed; reply_lost counts those calls whose reply never came (applied or not, nothing was given back).
# TYPE charon_redis_late_grants_total counter
charon_redis_late_grants_total{outcome="given_back"} 5
charon_redis_late_grants_total{outcome="refund_failed"} 1
charon_redis_late_grants_total{outcome="reply_lost"} 2
# HELP charon_redis_slot_undos_total Slots of Redis Cluster calls spanning slots that had granted when another slot rejected (or failed), by what became of their grants: given_back, or undo_failed (the hits stay counted until they leave their window: only ever less granted).
# TYPE charon_redis_slot_undos_total counter
charon_redis_slot_undos_total{outcome="given_back"} 7
charon_redis_slot_undos_total{outcome="undo_failed"} 3
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}
