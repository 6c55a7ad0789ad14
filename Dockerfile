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
RUN go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/charon ./cmd/charon

FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION=dev
LABEL org.opencontainers.image.title="charon" \
      org.opencontainers.image.description="Rate limit service for Envoy, with burst tiers and copy-limited resources" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
COPY --from=build /out/charon /usr/local/bin/charon
COPY examples/config /etc/charon/config
USER 65532:65532
# 8081 gRPC (RLS, charon.v1, health), 8080 HTTP (/healthcheck, /json),
# 6070 debug (/metrics; loopback unless CHARON_DEBUG_ADDR opens it).
EXPOSE 8081 8080 6070
ENV CHARON_CONFIG=/etc/charon/config
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["/usr/local/bin/charon", "health", "--addr", "127.0.0.1:8081"]
ENTRYPOINT ["/usr/local/bin/charon"]
CMD ["serve"]
