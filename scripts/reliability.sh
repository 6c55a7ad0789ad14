#!/usr/bin/env bash
# Usage: scripts/reliability.sh
# Runs the fault tests (Redis killed under load, Sentinel failovers, killed
# servers and holders) against real redis-server processes and prints the
# figures they measure: client latencies while Redis is down, recovery and
# failover times, how long a dead holder's copies stay held. `make test` runs
# the same tests but asserts only invariants and the deadlines the code
# enforces; these figures depend on the machine and are reported, not judged.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
run() {
	local pkg=$1 tests=$2
	if ! CHARON_REQUIRE_REDIS=1 CHARON_RELIABILITY=1 $GO test -count=1 -v -timeout 15m -run "$tests" "$pkg" >"$log" 2>&1; then
		status=1
		grep -E -- '--- FAIL|^FAIL|panic:' "$log" || true
	fi
	grep -o 'reliability: .*' "$log" | sed 's/^reliability: /| /; s/$/ |/' || true
}
echo "reliability report ($(date -u +%Y-%m-%dT%H:%MZ), $(getconf _NPROCESSORS_ONLN) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg))"
echo
echo "| what was measured |"
echo "| --- |"
run ./cmd/charon '^(TestRedisKilledUnderLoad|TestRedisSlowed|TestRedisFaultDeadlines|TestRedisCopiesSurviveAKilledServer|TestReserveProcessKilled|TestReloadStormThenSIGTERMUnderLoad|TestBadInputTouchesNoRedis|TestMillionValuesBounded|TestMemoryUnderFlood)$'
run ./internal/store/redisstore '^TestSentinelFailover$'
run ./internal/store/resilient '^(TestClusterReshardUnderLoad|TestClusterReshardExactCounts)$'
run ./internal/copystore/rediscopy '^(TestSentinelFailoverLoss|TestSentinelFailoverLossUnderLoad)$'
exit $status
