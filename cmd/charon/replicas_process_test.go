package main

import (
	"strings"
	"testing"
	"time"

	"github.com/charonlimit/charon/internal/redistest"
)

// stateKeys is the number of rate-limit state keys (charon:{...}) in the
// Redis on port, beside the presence key every process keeps there.
func stateKeys(port int) int {
	out, err := redistest.CLI(port, "--scan", "--pattern", "charon:{*")
	if err != nil {
		return 0
	}
	return len(strings.Fields(out))
}

// TestLocalModeSharesTheLimit runs three `charon serve --store redis`
// processes on one redis-server: they count each other (the gauge
// charon_store_replicas reaches 3 on each), then Redis is killed, and a
// burst of three times the limit through each process is decided by each
// process's local failure mode with a third of the limit, rounded down:
// floor(20/3) = 6 each, 18 in all, within the limit of 20. Before, each
// process granted the whole limit during an outage: 60 in all.
func TestLocalModeSharesTheLimit(t *testing.T) {
	r := redistest.Single(t)
	bin := buildCharon(t)
	cfg := writeRedisConfig(t)
	url := "redis://" + r.Addr()
	var procs []*proc
	for range 3 {
		procs = append(procs, startServe(t, bin, "--config", cfg, "--store", "redis", "--redis-url", url))
	}
	for _, p := range procs {
		eventually(t, "charon_store_replicas 3 on "+p.grpcAddr, func() bool {
			return metricValue(get(t, "http://"+p.debugAddr+"/metrics"), "charon_store_replicas") == 3
		})
	}
	r.Kill()

	total := 0
	for i, p := range procs {
		got := burstWithin(t, []*proc{p}, 3*testLimit, 5*time.Second, "user", "during-outage")
		if want := testLimit / 3; got != want {
			t.Errorf("process %d granted %d of a limit of %d with Redis killed, want its share %d", i, got, testLimit, want)
		}
		total += got
		m := get(t, "http://"+p.debugAddr+"/metrics")
		if n := metricValue(m, `charon_store_calls_total{path="local"}`); n < 3*testLimit {
			t.Errorf("process %d: %v decisions by the local failure mode, want at least %d", i, n, 3*testLimit)
		}
		if n := metricValue(m, "charon_store_replicas"); n != 3 {
			t.Errorf("process %d: charon_store_replicas %v with Redis killed, want the 3 counted before", i, n)
		}
		if !strings.Contains(p.stderr.String(), "replicas sharing the redis store") {
			t.Errorf("process %d did not log the replicas it counted:\n%s", i, p.stderr.String())
		}
	}
	if total > testLimit {
		t.Errorf("three processes granted %d in all with Redis killed, over the limit of %d", total, testLimit)
	}
	t.Logf("Redis killed: three processes granted %d of a limit of %d (each its share, %d)", total, testLimit, testLimit/3)
	for _, p := range procs {
		p.stop(t)
	}
}
