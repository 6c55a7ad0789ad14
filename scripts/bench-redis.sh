#!/usr/bin/env bash
# Usage: scripts/bench-redis.sh [path/to/charon]
# Starts a redis-server and two `charon serve` processes (the in-memory store
# and the Redis store, at default settings) on free loopback ports with
# examples/config, and runs `charon bench` against each in three workloads:
#   users  one descriptor {user} over KEYS (10000) uniform users (1000/s each)
#   hot    one hot key limited to 100/s (nearly every request over the limit)
#   busy   one hot key far under its limit (100 million a minute): with
#          SERVE_FLAGS=--escrow, decided from escrow leases
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
#
# Then the Cluster workloads (CLUSTER=0 skips them): a 3-master Redis
# Cluster of three more redis-server processes, a third `charon serve` on it
# (redis-cluster://), and the workloads users and three against it, taking
# turns with the others; Redis CPU per request is summed over the three
# nodes.
#
# To compare with another RLS v3 server (envoyproxy/ratelimit, say) loaded by
# the same client in the same rounds, start it yourself with the domain
# `bench` of examples/config/bench.yaml and pass its gRPC address and the
# PIDs of its redis-server processes: OTHER_ADDR and OTHER_REDIS_PIDS for
# one on a single Redis (workloads users, hot, three), OTHER_CLUSTER_ADDR and
# OTHER_CLUSTER_PIDS (space separated) for one on its own Cluster (users,
# three). The script then prints Charon / other ratios per topology.
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

redis_pid=${pids[0]}
cluster=${CLUSTER:-1}
cluster_pids=""
if [ "$cluster" = 1 ]; then
	# Three masters; each node's cluster bus is its port + 10000.
	cports=()
	for i in 1 2 3; do
		while :; do
			pick cp
			if [ "$cp" -lt 22000 ] && ! (exec 3<>"/dev/tcp/127.0.0.1/$((cp + 10000))") 2>/dev/null; then break; fi
		done
		cports+=("$cp")
	done
	cdir=$(mktemp -d)
	for cp in "${cports[@]}"; do
		mkdir -p "$cdir/$cp"
		"$redis_server" --port "$cp" --bind 127.0.0.1 --save '' --appendonly no --protected-mode no \
			--cluster-enabled yes --cluster-config-file "$cdir/$cp/nodes.conf" --cluster-node-timeout 2000 \
			--dir "$cdir/$cp" --loglevel warning --logfile '' >/dev/null &
		pids+=($!)
		cluster_pids="$cluster_pids $!"
	done
	for cp in "${cports[@]}"; do
		for _ in $(seq 100); do
			if redis-cli -p "$cp" ping >/dev/null 2>&1; then break; fi
			sleep 0.05
		done
	done
	redis-cli --cluster create "${cports[@]/#/127.0.0.1:}" --cluster-replicas 0 --cluster-yes >/dev/null
	for _ in $(seq 200); do
		if redis-cli -p "${cports[0]}" cluster info | grep -q cluster_state:ok; then break; fi
		sleep 0.05
	done
	pick clu_grpc; pick clu_http; pick clu_debug
fi

read -ra flags <<<"${SERVE_FLAGS:-}"
serve memory "$mem_grpc" "$mem_http" "$mem_debug" ${flags[@]+"${flags[@]}"}
serve redis "$red_grpc" "$red_http" "$red_debug" --store redis --redis-url "redis://127.0.0.1:$redis" ${flags[@]+"${flags[@]}"}
if [ "$cluster" = 1 ]; then
	seeds=$(IFS=,; echo "${cports[*]/#/127.0.0.1:}")
	serve cluster "$clu_grpc" "$clu_http" "$clu_debug" --store redis --redis-url "redis-cluster://$seeds" ${flags[@]+"${flags[@]}"}
	echo "Redis Cluster $seeds"
fi

echo "redis-server 127.0.0.1:$redis; concurrency $concurrency, $keys keys, deadline $timeout, $rounds rounds of $duration per run${SERVE_FLAGS:+; serve $SERVE_FLAGS}"
run() { # grpc workload
	local grpc=$1 w
	case $2 in
	users) w=(--key user --keys "$keys") ;;
	hot) w=(--key hot --hot) ;;
	busy) w=(--key busy --hot) ;;
	three) w=(--three --keys "$keys") ;;
	esac
	"$bin" bench --addr "127.0.0.1:$grpc" --domain bench --concurrency "$concurrency" --duration "$duration" \
		--timeout "$timeout" "${w[@]}"
}
# redis_cpu [PID...]: the CPU time so far of redis-server (or of the
# processes PID...), in clock ticks (utime + stime), summed.
redis_cpu() {
	local p t=0
	for p in ${@:-$redis_pid}; do t=$((t + $(awk '{ print $14 + $15 }' "/proc/$p/stat"))); done
	echo "$t"
}
ticks=$(getconf CLK_TCK)
debug=$red_debug
# metric NAME: the Redis server's (at $debug) value of NAME now (0 when absent).
metric() {
	curl -fsS "http://127.0.0.1:$debug/metrics" | awk -v n="$1" '$1 == n { v = $2 } END { print v + 0 }'
}
paths="remote cached local open closed unavailable"
snapshot() { # prints the store counters, one per line
	for p in $paths; do metric "charon_store_calls_total{path=\"$p\"}"; done
	metric charon_store_overlimit_cache_hits_total
	metric charon_store_overlimit_cache_misses_total
	metric charon_store_breaker_opens_total
	for p in local_granted local_rejected remote; do metric "charon_escrow_decisions_total{path=\"$p\"}"; done
	metric charon_escrow_calls_total
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
			lg = d[n + 4]; lr = d[n + 5]; re = d[n + 6]; lc = d[n + 7]
			if (lg + lr > 0) printf "  escrow: %d descriptors granted and %d rejected from leases, %d on Redis; %d lease calls (%.5f per leased descriptor)\n", lg, lr, re, lc, lc / (lg + lr)
		}'
}

# The runs take turns for ROUNDS rounds, so that the machine's changes of
# speed weigh on all alike; each one's throughput is its requests over its
# time summed over the rounds.
workloads="users hot busy three"
cworkloads="users three"
all=""
cpu=""
reqs() { awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^requests=/) { split($i, kv, "="); print kv[2] } }' <<<"$1"; }
# other NAME ADDR WORKLOAD PIDS...: a run against another RLS server, with
# the CPU of its Redis processes.
other() {
	local name=$1 addr=$2 w=$3 c0 out
	shift 3
	c0=$(redis_cpu "$@")
	out=$("$bin" bench --addr "$addr" --domain bench --concurrency "$concurrency" --duration "$duration" \
		--timeout "$timeout" $(case $w in users) echo --key user --keys "$keys" ;; hot) echo --key hot --hot ;; busy) echo --key busy --hot ;; three) echo --three --keys "$keys" ;; esac))
	echo "round $r $name $w: $out"
	all="${all}${name}_$w $out"$'\n'
	ticks_used=$(($(redis_cpu "$@") - c0))
	cpu="${cpu}${name}_$w $(reqs "$out") $ticks_used"$'\n'
	echo "  redis-server CPU per request: $(awk -v t="$ticks_used" -v n="$(reqs "$out")" -v hz="$ticks" 'BEGIN { if (n > 0) printf "%.1f µs", t / hz * 1e6 / n; else print "n/a" }')"
}
for r in $(seq "$rounds"); do
	for w in $workloads; do
		out=$(run "$mem_grpc" "$w"); echo "round $r memory $w: $out"; all="${all}mem_$w $out"$'\n'
		debug=$red_debug
		before=$(snapshot); c0=$(redis_cpu)
		out=$(run "$red_grpc" "$w"); echo "round $r redis  $w: $out"; all="${all}red_$w $out"$'\n'
		report "$before" "$(snapshot)" "$(reqs "$out")" "$(($(redis_cpu) - c0))"
		cpu="${cpu}red_$w $(reqs "$out") $(($(redis_cpu) - c0))"$'\n'
		if [ -n "${OTHER_ADDR:-}" ]; then
			# shellcheck disable=SC2086
			other other "$OTHER_ADDR" "$w" ${OTHER_REDIS_PIDS:?OTHER_REDIS_PIDS: its redis-server PIDs}
		fi
		if [ "$cluster" = 1 ] && [[ " $cworkloads " == *" $w "* ]]; then
			debug=$clu_debug
			# shellcheck disable=SC2086
			before=$(snapshot); c0=$(redis_cpu $cluster_pids)
			out=$(run "$clu_grpc" "$w"); echo "round $r cluster $w: $out"; all="${all}clu_$w $out"$'\n'
			# shellcheck disable=SC2086
			cused=$(($(redis_cpu $cluster_pids) - c0))
			report "$before" "$(snapshot)" "$(reqs "$out")" "$cused"
			cpu="${cpu}clu_$w $(reqs "$out") $cused"$'\n'
			if [ -n "${OTHER_CLUSTER_ADDR:-}" ]; then
				# shellcheck disable=SC2086
				other ocl "$OTHER_CLUSTER_ADDR" "$w" ${OTHER_CLUSTER_PIDS:?OTHER_CLUSTER_PIDS: its redis-server PIDs}
			fi
		fi
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
ratio() { awk -v a="$2" -v b="$3" -v n="$1" -v what="${4:-redis / memory}" 'BEGIN { if (a > 0 && b > 0) printf "ratio %s %s = %.2f\n", n, what, a / b; else printf "ratio %s: a run failed\n", n }'; }
for w in $workloads; do ratio "$w" "$(rps "red_$w")" "$(rps "mem_$w")"; done
# cpureq NAME: Redis CPU µs per request over the rounds.
cpureq() { awk -v m="$1" -v hz="$ticks" '$1 == m { n += $2; t += $3 } END { if (n > 0) printf "%.1f", t / hz * 1e6 / n; else print 0 }' <<<"$cpu"; }
cmp() { # topology ours theirs workload
	awk -v t="$1" -v w="$4" -v a="$(rps "$2_$4")" -v b="$(rps "$3_$4")" -v ca="$(cpureq "$2_$4")" -v cb="$(cpureq "$3_$4")" 'BEGIN {
		if (a > 0 && b > 0 && cb > 0) printf "%s %s: charon %d req/s, other %d req/s, ratio %.2f; Redis CPU per request %.1f / %.1f µs (%.2fx)\n", t, w, a, b, a / b, ca, cb, ca / cb
		else printf "%s %s: a run failed\n", t, w }'
}
if [ "$cluster" = 1 ]; then
	for w in $cworkloads; do
		echo "clu_$w: $(rps "clu_$w") req/s, Redis CPU $(cpureq "clu_$w") µs per request over $rounds rounds"
		ratio "$w" "$(rps "clu_$w")" "$(rps "mem_$w")" "cluster / memory"
	done
fi
if [ -n "${OTHER_ADDR:-}" ]; then
	for w in $workloads; do cmp single red other "$w"; done
fi
if [ -n "${OTHER_CLUSTER_ADDR:-}" ]; then
	for w in $cworkloads; do cmp cluster clu ocl "$w"; done
fi
