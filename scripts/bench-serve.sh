# Sourced (not run) by scripts/bench.sh and scripts/bench-redis.sh, from the
# repository's root with bin set to the charon binary: the settings the
# benches share, free loopback ports, and `charon serve` processes that are
# stopped when the sourcing script exits.
concurrency=${CONCURRENCY:-64}
keys=${KEYS:-10000}
duration=${DURATION:-5s}
rounds=${ROUNDS:-3}

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

pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

serve() { # name grpc http debug args...: charon serve with examples/config, once healthy
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
