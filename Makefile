# Charon: `make run` serves examples/config on the in-memory store;
# `make test` is what CI runs.
GO       ?= go
BIN      ?= bin/charon
FUZZTIME ?= 20s
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# Extra `go test` flags: .ci/run passes -count=1 so no result is reused.
TESTFLAGS ?=

.PHONY: all build sim sim-wasm release image run test test-stress reliability bench bench-redis fuzz generate generate-check clean

all: build

build: sim-wasm
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o $(BIN) ./cmd/charon

# The tier simulator's engine: package tiers and the config loader compiled to
# WebAssembly (internal/sim/web/charon.wasm, embedded in the binary; not
# checked in).
sim-wasm:
	$(GO) generate ./internal/sim

# The simulator as static files in bin/sim (open bin/sim/index.html through
# any static file server).
sim: sim-wasm
	$(GO) run ./cmd/charon sim --out bin/sim

# Static binaries for linux/amd64 and linux/arm64, version stamped, in dist/
# with their SHA-256 sums.
release: sim-wasm
	rm -rf dist && mkdir -p dist
	@set -e; for arch in amd64 arm64; do \
		echo "dist/charon-linux-$$arch"; \
		CGO_ENABLED=0 GOOS=linux GOARCH=$$arch $(GO) build -trimpath -ldflags "-s -w -X main.version=$(VERSION)" \
			-o dist/charon-linux-$$arch ./cmd/charon; \
	done
	cd dist && sha256sum charon-linux-* > SHA256SUMS

run: sim-wasm
	$(GO) run ./cmd/charon serve --config examples/config

# The product's module, then deploy/ (its own module: Helm, Kubernetes and
# BuildKit stay out of the product's go.mod).
# -timeout 30m: on a machine whose cores are all busy, the Redis store's
# suite (Cluster conformance traces under -race) can pass go test's default
# 10 minutes per package; CI allows 90 minutes in all.
test: sim-wasm
	$(GO) vet ./...
	$(GO) test -race -timeout 30m $(TESTFLAGS) ./...
	# Heap figures mean nothing under -race: the pair-cost bound runs without it.
	$(GO) test $(TESTFLAGS) -run '^TestPairCost$$' ./internal/store/memstore
	cd deploy && $(GO) vet ./... && $(GO) test -race -timeout 30m $(TESTFLAGS) ./...

# The container image (needs a Docker engine): charon:$(VERSION), also
# tagged charon:latest, the image the Helm chart and deploy/kubernetes run
# (load it into the cluster, e.g. kind load docker-image charon:latest, or
# push it to a registry).
image:
	docker build --build-arg VERSION=$(VERSION) -t charon:$(VERSION) -t charon:latest .

# make test RUNS (5) times back to back with a CPU hog on every core (stopped
# by PID at the end), as on a busy CI machine; fails if any run fails.
test-stress:
	scripts/test-stress.sh

# Runs the fault tests against real redis-server processes and prints the
# latency, recovery and failover figures they measure (not part of make test).
reliability:
	scripts/reliability.sh

# Starts a server on free ports with examples/config, measures the no-op
# ceiling (gRPC health Check) and ShouldRateLimit at concurrency 64 over
# 10,000 keys, and prints the ratio.
bench: build
	scripts/bench.sh $(BIN)

# Starts a redis-server (killed at the end) and two servers on free ports,
# the in-memory store and the Redis store, and measures ShouldRateLimit at
# concurrency 64 over 10,000 keys and the hot over-limit key on both; prints
# the ratios Redis / memory.
bench-redis: build
	scripts/bench-redis.sh $(BIN)

# Runs every fuzz target for FUZZTIME each.
fuzz:
	@set -e; for f in $$(grep -rl --include='*_test.go' '^func Fuzz' .); do \
		dir=$$(dirname $$f); \
		for name in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$f); do \
			echo "== $$dir $$name"; \
			$(GO) test -run='^$$' -fuzz="^$$name\$$" -fuzztime=$(FUZZTIME) $$dir; \
		done; \
	done

# Regenerates api/charon/v1 from charon.proto with pinned, locally installed
# buf, protoc-gen-go and protoc-gen-go-grpc; the output is checked in.
generate:
	scripts/generate.sh

# Fails when make generate would change api/charon/v1.
generate-check: generate
	git diff --exit-code -- api/charon/v1
	@test -z "$$(git status --porcelain -- api/charon/v1)" || { git status --porcelain -- api/charon/v1; exit 1; }

clean:
	rm -rf bin dist
