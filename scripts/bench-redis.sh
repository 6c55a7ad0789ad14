#!/usr/bin/env bash
# Usage: scripts/bench-redis.sh [path/to/charon]
# Starts a redis-server and two `charon serve` processes (the in-memory store
# and the Redis store) on free loopback ports with examples/config, and runs
# `charon bench` against each: ShouldRateLimit at CONCURRENCY over KEYS uniform
# keys, then the hot over-limit key (--hot: one value far over its 1000/s
# limit). The four runs take turns for ROUNDS (3) rounds of DURATION (5s).
# Prints how the Redis server's decisions were made in each run
# (charon_store_calls_total by path) and its over-limit cache's hit ratio,
# then the throughput ratios Redis / memory over the rounds. Everything
# shares this machine (Redis included), so only the ratios are meaningful.
#
# The Redis server runs with --redis-timeout REDIS_TIMEOUT (default 1s, not
# the production 10ms): on a loaded machine at concurrency 64 some calls take
# over 10 ms and the breaker would send decisions to the local failure mode,
# which would measure the memory store again.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-bin/charon}
concurrency=${CONCURRENCY:-64}
keys=${KEYS:-10000}
duration=${DURATION:-5s}
rounds=${ROUNDS:-3}
redis_timeout=${REDIS_TIMEOUT:-1s}
redis_server=${REDIS_SERVER:-redis-server}

if ! command -v "$redis_server" >/dev/null; then
	echo "redis-server not found (apt-get install redis-server)" >&2
	exit 1
fi

used=" "
pick() { # sets the named variable to a free port not picked before
	local p
	for _ in $(seq 500); do
		p=$((20000 + RANDOM % 12000)) # below Linux's ephemeral ports (32768-)
		case "$used" in *" $p "*) continue ;; esac
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			used="$used$p "
			printf -v "$1" '%s' "$p"
			return 0
		fi
	done
	echo "no free port found" >&2
	return 1
}
pick redis
pick mem_grpc; pick mem_http; pick mem_debug
pick red_grpc; pick red_http; pick red_debug

pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

"$redis_server" --port "$redis" --bind 127.0.0.1 --save '' --appendonly no --protected-mode no \
	--loglevel warning --logfile '' >/dev/null &
pids+=($!)
for _ in $(seq 100); do
	if (exec 3<>"/dev/tcp/127.0.0.1/$redis") 2>/dev/null; then break; fi
	sleep 0.05
done

serve() { # name grpc http debug args...
	local name=$1 grpc=$2 http=$3 debug=$4
	shift 4
	LOG_LEVEL=warn "$bin" serve --config examples/config \
		--grpc-addr "127.0.0.1:$grpc" --http-addr "127.0.0.1:$http" --debug-addr "127.0.0.1:$debug" "$@" &
	pids+=($!)
	local pid=$!
	for _ in $(seq 100); do
		if curl -fsS "http://127.0.0.1:$http/healthcheck" >/dev/null 2>&1; then return 0; fi
		if ! kill -0 "$pid" 2>/dev/null; then echo "charon serve ($name) exited" >&2; exit 1; fi
		sleep 0.1
	done
	echo "charon serve ($name) not healthy" >&2
	exit 1
}
serve memory "$mem_grpc" "$mem_http" "$mem_debug"
serve redis "$red_grpc" "$red_http" "$red_debug" --store redis --redis-url "redis://127.0.0.1:$redis" \
	--redis-timeout "$redis_timeout"

echo "redis-server 127.0.0.1:$redis; concurrency $concurrency, $keys keys, $rounds rounds of $duration per run"
run() { # grpc extra-args...
	local grpc=$1
	shift
	"$bin" bench --addr "127.0.0.1:$grpc" --domain bench --key user --concurrency "$concurrency" --duration "$duration" "$@"
}
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
report() { # before after: the counters' moves during a run
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

# The four runs take turns for ROUNDS rounds, so that the machine's changes of
# speed weigh on all alike; each one's throughput is its requests over its
# time summed over the rounds.
all=""
for r in $(seq "$rounds"); do
	out=$(run "$mem_grpc" --keys "$keys"); echo "round $r memory $keys keys: $out"; all="${all}mem_keys $out"$'\n'
	before=$(snapshot)
	out=$(run "$red_grpc" --keys "$keys"); echo "round $r redis  $keys keys: $out"; all="${all}red_keys $out"$'\n'
	report "$before" "$(snapshot)"
	out=$(run "$mem_grpc" --hot); echo "round $r memory hot key:    $out"; all="${all}mem_hot $out"$'\n'
	before=$(snapshot)
	out=$(run "$red_grpc" --hot); echo "round $r redis  hot key:    $out"; all="${all}red_hot $out"$'\n'
	report "$before" "$(snapshot)"
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
for m in mem_keys red_keys mem_hot red_hot; do echo "$m: $(rps "$m") req/s over $rounds rounds"; done
ratio() { awk -v a="$2" -v b="$3" -v n="$1" 'BEGIN { if (a > 0 && b > 0) printf "ratio %s redis / memory = %.2f\n", n, a / b; else printf "ratio %s: a run failed\n", n }'; }
ratio "$keys keys" "$(rps red_keys)" "$(rps mem_keys)"
ratio "hot key" "$(rps red_hot)" "$(rps mem_hot)"
