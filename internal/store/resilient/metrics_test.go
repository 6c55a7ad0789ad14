package resilient_test

import (
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/charonlimit/charon/internal/store/resilient"
)

func TestCollectorExportsStats(t *testing.T) {
	reg := prometheus.NewRegistry()
	st := resilient.Stats{Remote: 10, Cached: 4, Local: 3, RemoteErrors: 2, Timeouts: 1, Slow: 8, NotSent: 9, Stuck: 11,
		Breaker: resilient.BreakerOpen, BreakerOpens: 5, CacheHits: 4, CacheMisses: 12, CacheSize: 7, CacheEvictions: 6,
		DebtDeferred: 13, DebtFlushes: 14, DebtFlushErrors: 15, Replicas: 3,
		Shards: []resilient.ShardStats{{Name: "10.0.0.1:6379", Breaker: resilient.BreakerOpen, BreakerOpens: 2, Failures: 9}, {Name: "10.0.0.2:6379", Failures: 1}}}
	reg.MustRegister(resilient.NewCollector(func() resilient.Stats { return st }))
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		if !strings.HasPrefix(f.GetName(), "charon_store_") {
			continue
		}
		for _, mt := range f.GetMetric() {
			name := f.GetName()
			for _, l := range mt.GetLabel() {
				name += "{" + l.GetName() + "=" + l.GetValue() + "}"
			}
			got[name] = value(mt)
		}
	}
	want := map[string]float64{
		"charon_store_calls_total{path=remote}":                         10,
		"charon_store_calls_total{path=cached}":                         4,
		"charon_store_calls_total{path=local}":                          3,
		"charon_store_calls_total{path=open}":                           0,
		"charon_store_calls_total{path=closed}":                         0,
		"charon_store_calls_total{path=unavailable}":                    0,
		"charon_store_remote_errors_total":                              2,
		"charon_store_remote_timeouts_total":                            1,
		"charon_store_remote_slow_total":                                8,
		"charon_store_not_sent_total":                                   9,
		"charon_store_not_sent_stuck_total":                             11,
		"charon_store_breaker_state":                                    1,
		"charon_store_breaker_opens_total":                              5,
		"charon_store_overlimit_cache_hits_total":                       4,
		"charon_store_overlimit_cache_misses_total":                     12,
		"charon_store_overlimit_cache_entries":                          7,
		"charon_store_overlimit_cache_evictions_total":                  6,
		"charon_store_debt_deferred_total":                              13,
		"charon_store_debt_flushes_total":                               14,
		"charon_store_debt_flush_errors_total":                          15,
		"charon_store_replicas":                                         3,
		"charon_store_master_breaker_state{master=10.0.0.1:6379}":       1,
		"charon_store_master_breaker_opens_total{master=10.0.0.1:6379}": 2,
		"charon_store_master_failures_total{master=10.0.0.1:6379}":      9,
		"charon_store_master_breaker_state{master=10.0.0.2:6379}":       0,
		"charon_store_master_breaker_opens_total{master=10.0.0.2:6379}": 0,
		"charon_store_master_failures_total{master=10.0.0.2:6379}":      1,
	}
	if d := cmp.Diff(want, got); d != "" {
		keys := make([]string, 0, len(got))
		for k := range got {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		t.Errorf("store metrics (-want +got):\n%s\ngot names: %v", d, keys)
	}
}

func value(m *dto.Metric) float64 {
	if c := m.GetCounter(); c != nil {
		return c.GetValue()
	}
	return m.GetGauge().GetValue()
}
