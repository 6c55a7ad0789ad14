#!/usr/bin/env bash
# Regenerates the charon.v1 Go code from api/charon/v1/charon.proto with
# pinned, locally installed tools, after linting the proto. Running it twice
# gives byte-identical output.
#
# Tools: buf (compiles the proto itself, no protoc needed), protoc-gen-go at
# the version of google.golang.org/protobuf in go.mod, and protoc-gen-go-grpc.
# They are installed with `go install` into a cache directory per version
# (CHARON_TOOLS, default ${XDG_CACHE_HOME:-$HOME/.cache}/charon-tools) when
# missing; nothing outside that directory and api/ is written.
set -euo pipefail

BUF_VERSION=v1.75.0
GRPC_GEN_VERSION=v1.6.2

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

GO=${GO:-go}
PROTOBUF_VERSION=$($GO list -m -f '{{.Version}}' google.golang.org/protobuf)
tools=${CHARON_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/charon-tools}

# install DIR PKG VERSION BINARY: go install PKG@VERSION into DIR unless
# DIR/BINARY exists.
install() {
	local dir=$1 pkg=$2 version=$3 bin=$4
	if [[ ! -x "$dir/$bin" ]]; then
		echo "installing $pkg@$version" >&2
		mkdir -p "$dir"
		(cd "$dir" && GOBIN="$dir" $GO install "$pkg@$version")
	fi
}

bufdir="$tools/buf-$BUF_VERSION"
gendir="$tools/protoc-gen-go-$PROTOBUF_VERSION"
grpcdir="$tools/protoc-gen-go-grpc-$GRPC_GEN_VERSION"
install "$bufdir" github.com/bufbuild/buf/cmd/buf "$BUF_VERSION" buf
install "$gendir" google.golang.org/protobuf/cmd/protoc-gen-go "$PROTOBUF_VERSION" protoc-gen-go
install "$grpcdir" google.golang.org/grpc/cmd/protoc-gen-go-grpc "$GRPC_GEN_VERSION" protoc-gen-go-grpc

export PATH="$gendir:$grpcdir:$bufdir:$PATH"
cd api
buf lint
buf generate
echo "generated api/charon/v1 (buf $BUF_VERSION, protoc-gen-go $PROTOBUF_VERSION, protoc-gen-go-grpc $GRPC_GEN_VERSION)" >&2
