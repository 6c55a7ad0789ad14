#!/usr/bin/env bash
# Usage: scripts/test-stress.sh [RUNS]
# Runs `make test` RUNS times (default 5) back to back while a CPU hog keeps
# every core busy, as on a shared CI machine. The hogs are started here and
# stopped by PID at the end, whatever the outcome. Exits non-zero if any run
# failed; prints each run's result and time.
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${1:-${RUNS:-5}}
cores=$(getconf _NPROCESSORS_ONLN)

hogs=()
stop_hogs() {
	for p in "${hogs[@]}"; do kill "$p" 2>/dev/null; done
	for p in "${hogs[@]}"; do wait "$p" 2>/dev/null; done
}
trap stop_hogs EXIT
for _ in $(seq "$cores"); do
	( while :; do :; done ) &
	hogs+=($!)
done
echo "test-stress: $cores CPU hogs (pids ${hogs[*]}), $runs runs of make test"

failed=0
for i in $(seq "$runs"); do
	start=$(date +%s)
	if make test TESTFLAGS="${TESTFLAGS:--count=1}" >"/tmp/charon-test-stress.$i.log" 2>&1; then
		result=ok
	else
		result=FAIL
		failed=$((failed + 1))
	fi
	echo "test-stress: run $i: $result in $(($(date +%s) - start))s (log /tmp/charon-test-stress.$i.log)"
	if [ "$result" = FAIL ]; then grep -E -- '^(--- FAIL|FAIL|panic:)' "/tmp/charon-test-stress.$i.log" | head -20; fi
done
echo "test-stress: $((runs - failed)) of $runs runs passed"
[ "$failed" -eq 0 ]
