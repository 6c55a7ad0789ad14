#!/usr/bin/env bash
# Usage: scripts/bench-redis.sh [path/to/charon]
# Starts a redis-server and two `charon serve` processes (the in-memory store
# and the Redis store, at default settings) on free loopback ports with
# examples/config, and runs `charon bench` against each in three workloads:
#   users  one descriptor {user} over KEYS (10000) uniform users (1000/s each)
#   hot    one hot key limited to 100/s (nearly every request over the limit)
#   three  three descriptors per request: {user}, {tenant}, {api, user}
# The six runs take turns for ROUNDS (3) rounds of DURATION (5s), at
# CONCURRENCY (64), each request with a gRPC deadline of TIMEOUT (default 1s,
# a direct caller; TIMEOUT=20ms is what Envoy sends). After each Redis run it
# prints how that run's decisions were made (charon_store_calls_total by path:
# remote, cached by the over-limit cache, or a failure mode) so that a run
# whose decisions fell back to local state cannot pass for a Redis figure,
# and Redis' own CPU time per request (from /proc/PID/stat). Then the
# throughput ratios Redis / memory over the rounds. Everything shares this
# machine (Redis included), so only the ratios are meaningful. SERVE_FLAGS
# adds flags to both servers (e.g. SERVE_FLAGS=--fixed-window for
# envoyproxy/ratelimit's fixed windows).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-bin/charon}
timeout=${TIMEOUT:-1s}
redis_server=${REDIS_SERVER:-redis-server}

if ! command -v "$redis_server" >/dev/null; then
	echo "redis-server not found (apt-get install redis-server)" >&2
	exit 1
fi

source scripts/bench-serve.sh
pick redis
pick mem_grpc; pick mem_http; pick mem_debug
pick red_grpc; pick red_http; pick red_debug

"$redis_server" --port "$redis" --bind 127.0.0.1 --save '' --appendonly no --protected-mode no \
	--loglevel warning --logfile '' >/dev/null &
pids+=($!)
for _ in $(seq 100); do
	if (exec 3<>"/dev/tcp/127.0.0.1/$redis") 2>/dev/null; then break; fi
	sleep 0.05
done

read -ra flags <<<"${SERVE_FLAGS:-}"
serve memory "$mem_grpc" "$mem_http" "$mem_debug" ${flags[@]+"${flags[@]}"}
serve redis "$red_grpc" "$red_http" "$red_debug" --store redis --redis-url "redis://127.0.0.1:$redis" ${flags[@]+"${flags[@]}"}
redis_pid=${pids[0]}

echo "redis-server 127.0.0.1:$redis; concurrency $concurrency, $keys keys, deadline $timeout, $rounds rounds of $duration per run${SERVE_FLAGS:+; serve $SERVE_FLAGS}"
run() { # grpc workload
	local grpc=$1 w
	case $2 in
	users) w=(--key user --keys "$keys") ;;
	hot) w=(--key hot --hot) ;;
	three) w=(--three --keys "$keys") ;;
	esac
	"$bin" bench --addr "127.0.0.1:$grpc" --domain bench --concurrency "$concurrency" --duration "$duration" \
		--timeout "$timeout" "${w[@]}"
}
# redis_cpu: redis-server's CPU time so far, in clock ticks (utime + stime).
redis_cpu() { awk '{ print $14 + $15 }' "/proc/$redis_pid/stat"; }
ticks=$(getconf CLK_TCK)
# metric NAME: the Redis server's value of NAME now (0 when absent).
metric() {
	curl -fsS "http://127.0.0.1:$red_debug/metrics" | awk -v n="$1" '$1 == n { v = $2 } END { print v + 0 }'
}
paths="remote cached local open closed unavailable"
snapshot() { # prints the store counters, one per line
	for p in $paths; do metric "charon_store_calls_total{path=\"$p\"}"; done
	metric charon_store_overlimit_cache_hits_total
	metric charon_store_overlimit_cache_misses_total
	metric charon_store_breaker_opens_total
}
report() { # before after requests cpu-ticks: the counters' moves during a run
	echo "  redis-server CPU per request: $(awk -v t="$4" -v n="$3" -v hz="$ticks" 'BEGIN { if (n > 0) printf "%.1f µs", t / hz * 1e6 / n; else print "n/a" }')"
	paste <(echo "$1") <(echo "$2") | awk -v paths="$paths" '
		{ d[NR] = $2 - $1 }
		END {
			n = split(paths, p, " ")
			line = "  redis decisions by path:"
			for (i = 1; i <= n; i++) if (d[i] > 0) line = line " " p[i] "=" d[i]
			print line
			h = d[n + 1]; m = d[n + 2]
			if (h + m > 0) printf "  over-limit cache: %d hits, %d misses, hit ratio %.3f; breaker opened %d times\n", h, m, h / (h + m), d[n + 3]
		}'
}

# The runs take turns for ROUNDS rounds, so that the machine's changes of
# speed weigh on all alike; each one's throughput is its requests over its
# time summed over the rounds.
workloads="users hot three"
all=""
reqs() { awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^requests=/) { split($i, kv, "="); print kv[2] } }' <<<"$1"; }
for r in $(seq "$rounds"); do
	for w in $workloads; do
		out=$(run "$mem_grpc" "$w"); echo "round $r memory $w: $out"; all="${all}mem_$w $out"$'\n'
		before=$(snapshot); c0=$(redis_cpu)
		out=$(run "$red_grpc" "$w"); echo "round $r redis  $w: $out"; all="${all}red_$w $out"$'\n'
		report "$before" "$(snapshot)" "$(reqs "$out")" "$(($(redis_cpu) - c0))"
	done
done

rps() { # name: requests over time, summed over the rounds
	awk -v m="$1" '$1 == m {
		for (i = 2; i <= NF; i++) {
			split($i, kv, "=")
			if (kv[1] == "requests") { r = kv[2]; n += r }
			# the time of a run: its requests over its rate (duration= has units)
			if (kv[1] == "rps" && kv[2] > 0) d += r / kv[2]
		}
	} END { if (d > 0) printf "%.0f", n / d; else print 0 }' <<<"$all"
}
for w in $workloads; do echo "mem_$w: $(rps "mem_$w") req/s, red_$w: $(rps "red_$w") req/s over $rounds rounds"; done
ratio() { awk -v a="$2" -v b="$3" -v n="$1" 'BEGIN { if (a > 0 && b > 0) printf "ratio %s redis / memory = %.2f\n", n, a / b; else printf "ratio %s: a run failed\n", n }'; }
for w in $workloads; do ratio "$w" "$(rps "red_$w")" "$(rps "mem_$w")"; done
