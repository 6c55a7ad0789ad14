#!/usr/bin/env bash
# Usage: scripts/bench.sh [path/to/charon]
# Starts `charon serve` on free loopback ports with examples/config and the
# in-memory store, runs `charon bench --noop` (gRPC health Check: the no-op
# ceiling) and then ShouldRateLimit at the same concurrency over KEYS uniform
# keys, and prints the throughput ratio. Both runs share this machine, so only
# the ratio is meaningful. Then charon.v1 Reserve + Release pair runs (on
# Session streams, then as unary calls), and their cost relative to one
# ShouldRateLimit.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-bin/charon}
concurrency=${CONCURRENCY:-64}
keys=${KEYS:-10000}
duration=${DURATION:-10s}

used=" "
free_port() {
	local p
	for _ in $(seq 500); do
		p=$((20000 + RANDOM % 30000))
		case "$used" in *" $p "*) continue ;; esac
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			used="$used$p "
			echo "$p"
			return 0
		fi
	done
	echo "no free port found" >&2
	return 1
}
grpc=$(free_port); http=$(free_port); debug=$(free_port)
# Pick them in this shell (not in $(...)) so "used" keeps them distinct.
used=" $grpc $http $debug "
while [ "$http" = "$grpc" ]; do http=$(free_port); done
while [ "$debug" = "$grpc" ] || [ "$debug" = "$http" ]; do debug=$(free_port); done

LOG_LEVEL=warn "$bin" serve --config examples/config \
	--grpc-addr "127.0.0.1:$grpc" --http-addr "127.0.0.1:$http" --debug-addr "127.0.0.1:$debug" &
pid=$!
trap 'kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true' EXIT

for _ in $(seq 100); do
	if curl -fsS "http://127.0.0.1:$http/healthcheck" >/dev/null 2>&1; then break; fi
	if ! kill -0 "$pid" 2>/dev/null; then echo "charon serve exited" >&2; exit 1; fi
	sleep 0.1
done

echo "server: grpc 127.0.0.1:$grpc, concurrency $concurrency, $keys keys, $duration per run"
noop=$("$bin" bench --addr "127.0.0.1:$grpc" --noop --concurrency "$concurrency" --duration "$duration")
echo "$noop"
real=$("$bin" bench --addr "127.0.0.1:$grpc" --domain bench --key user --keys "$keys" \
	--concurrency "$concurrency" --duration "$duration")
echo "$real"

rps() { sed -n 's/.* rps=\([0-9.]*\) .*/\1/p' <<<"$1"; }
awk -v a="$(rps "$real")" -v b="$(rps "$noop")" \
	'BEGIN { if (b > 0) printf "ratio ShouldRateLimit / no-op = %.2f\n", a / b; else print "ratio: no-op run failed" }'

# charon.v1: a Reserve + Release pair of one copy (on a Session stream, as the
# Go client holds copies) against one ShouldRateLimit, same server, same run.
pair=$("$bin" bench --addr "127.0.0.1:$grpc" --reserve --domain bench --key seat --keys "$keys" \
	--concurrency "$concurrency" --duration "$duration")
echo "$pair"
awk -v a="$(rps "$real")" -v b="$(rps "$pair")" \
	'BEGIN { if (b > 0) printf "cost of a reserve+release pair / one ShouldRateLimit = %.2f\n", a / b; else print "ratio: reserve run failed" }'

# The same pair as two unary calls, for callers that cannot keep a stream.
unary=$("$bin" bench --addr "127.0.0.1:$grpc" --reserve --unary --domain bench --key seat --keys "$keys" \
	--concurrency "$concurrency" --duration "$duration")
echo "$unary"
awk -v a="$(rps "$real")" -v b="$(rps "$unary")" \
	'BEGIN { if (b > 0) printf "cost of a unary reserve+release pair / one ShouldRateLimit = %.2f\n", a / b; else print "ratio: unary reserve run failed" }'
