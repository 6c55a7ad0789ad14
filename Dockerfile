# syntax=docker/dockerfile:1
# The charon image: a static binary on distroless, as a non-root user, with
# no shell. Build: make image (or docker build --build-arg VERSION=v1.2.3 .).

FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
ENV CGO_ENABLED=0
# The tier simulator's engine (WebAssembly), embedded in the binary.
RUN go generate ./internal/sim
# The examples copied below are --config's default: the lowest precedence, so
# --config, CHARON_CONFIG and envoyproxy/ratelimit's RUNTIME_* variables all
# replace it (an ENV CHARON_CONFIG would outrank a migrated RUNTIME_ROOT).
RUN go build -trimpath -ldflags "-s -w -X main.version=${VERSION} -X main.defaultConfigDir=/etc/charon/config" -o /out/charon ./cmd/charon
# envoyproxy/ratelimit's deployments run the command /bin/ratelimit: a link
# to charon, which serves when run under that name. A link in a directory, as
# COPY keeps links inside a directory but follows a link given as its source.
RUN mkdir -p /out/bin && ln -s /usr/local/bin/charon /out/bin/ratelimit

FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION=dev
LABEL org.opencontainers.image.title="charon" \
      org.opencontainers.image.description="Rate limit service for Envoy, with burst tiers and copy-limited resources" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
COPY --from=build /out/charon /usr/local/bin/charon
COPY --from=build /out/bin/ /bin/
COPY examples/config /etc/charon/config
USER 65532:65532
# 8081 gRPC (RLS, charon.v1, health), 8080 HTTP (/healthcheck, /json),
# 6070 debug (/metrics; loopback unless CHARON_DEBUG_ADDR opens it).
EXPOSE 8081 8080 6070
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["/usr/local/bin/charon", "health", "--addr", "127.0.0.1:8081"]
ENTRYPOINT ["/usr/local/bin/charon"]
CMD ["serve"]
