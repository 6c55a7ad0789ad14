#!/usr/bin/env bash
# Usage: scripts/bench.sh [path/to/charon]
# Starts `charon serve` on free loopback ports with examples/config and the
# in-memory store, and runs `charon bench` at CONCURRENCY (64) in four modes:
# the gRPC health Check (the no-op ceiling), ShouldRateLimit over KEYS (10000)
# uniform keys, ShouldRateLimit of three descriptors ({user}, {tenant},
# {api, user}), and charon.v1 Reserve + Release pairs on Session streams and
# as unary calls. The modes take turns for ROUNDS (3) rounds of DURATION (5s)
# each, so that the machine's changes of speed weigh on all alike; it prints
# each mode's throughput and median p99, ShouldRateLimit's throughput as a
# ratio of the no-op's, and what a pair costs in ShouldRateLimits. Client and
# server share this machine, so only the ratios are meaningful.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-bin/charon}
source scripts/bench-serve.sh
pick grpc; pick http; pick debug
serve memory "$grpc" "$http" "$debug"

echo "server: grpc 127.0.0.1:$grpc, concurrency $concurrency, $keys keys, $rounds rounds of $duration per mode"

# The modes run in turn, round after round, so that a change in the machine's
# speed during the run weighs on every mode alike; each mode's throughput is
# its requests over its time summed over the rounds, its p99 the median of
# the rounds'.
run() { # mode: one bench run of that mode
	case $1 in
	noop) "$bin" bench --addr "127.0.0.1:$grpc" --noop --concurrency "$concurrency" --duration "$duration" ;;
	ratelimit) "$bin" bench --addr "127.0.0.1:$grpc" --domain bench --key user --keys "$keys" \
		--concurrency "$concurrency" --duration "$duration" ;;
	# three descriptors per request: {user}, {tenant}, {api, user}
	three) "$bin" bench --addr "127.0.0.1:$grpc" --domain bench --three --keys "$keys" \
		--concurrency "$concurrency" --duration "$duration" ;;
	# charon.v1: a Reserve + Release pair of one copy on a Session stream, as
	# the Go client holds copies, and the same pair as two unary calls.
	pair) "$bin" bench --addr "127.0.0.1:$grpc" --reserve --domain bench --key seat --keys "$keys" \
		--concurrency "$concurrency" --duration "$duration" ;;
	unary) "$bin" bench --addr "127.0.0.1:$grpc" --reserve --unary --domain bench --key seat --keys "$keys" \
		--concurrency "$concurrency" --duration "$duration" ;;
	esac
}
modes="noop ratelimit three pair unary"
all=""
for r in $(seq "$rounds"); do
	for m in $modes; do
		out=$(run "$m")
		echo "round $r $m: $out"
		all="$all$m $out"$'\n'
	done
done

# summary: per mode, "mode rps p99-median-ms errors"
summary=$(awk '
	function ms(v) { if (v ~ /µs$/) return substr(v, 1, length(v) - 2) / 1000; if (v ~ /ms$/) return substr(v, 1, length(v) - 2) + 0; return substr(v, 1, length(v) - 1) * 1000 }
	$2 ~ /^mode=/ {
		m = $1
		for (i = 2; i <= NF; i++) {
			split($i, kv, "=")
			if (kv[1] == "requests") { r = kv[2]; n[m] += r }
			# the time of a run: its requests over its rate (duration= has units)
			if (kv[1] == "rps" && kv[2] > 0) d[m] += r / kv[2]
			if (kv[1] == "errors") e[m] += kv[2]
			if (kv[1] == "p99") { c[m]++; p[m, c[m]] = ms(kv[2]) }
		}
	}
	END {
		for (m in n) {
			k = c[m]
			for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (p[m, j] < p[m, i]) { t = p[m, i]; p[m, i] = p[m, j]; p[m, j] = t }
			med = (k % 2) ? p[m, (k + 1) / 2] : (p[m, k / 2] + p[m, k / 2 + 1]) / 2
			printf "%s %.0f %.2f %d\n", m, (d[m] > 0 ? n[m] / d[m] : 0), med, e[m]
		}
	}' <<<"$all")
echo "$summary" | sort | awk '{ printf "%-9s %8d req/s  p99 (median of rounds) %.2f ms  errors %d\n", $1, $2, $3, $4 }'
get() { awk -v m="$1" '$1 == m { print $2 }' <<<"$summary"; }
ratio() { # label numerator denominator
	awk -v l="$1" -v a="$2" -v b="$3" 'BEGIN { if (a > 0 && b > 0) printf "%s = %.2f\n", l, a / b; else printf "%s: a run failed\n", l }'
}
ratio "ratio ShouldRateLimit / no-op" "$(get ratelimit)" "$(get noop)"
ratio "ratio ShouldRateLimit of three descriptors / no-op" "$(get three)" "$(get noop)"
ratio "cost of a reserve+release pair / one ShouldRateLimit" "$(get ratelimit)" "$(get pair)"
ratio "cost of a unary reserve+release pair / one ShouldRateLimit" "$(get ratelimit)" "$(get unary)"
