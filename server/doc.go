// Package server serves Charon to the network: Envoy's RateLimitService v3
// and the charon.v1 API (bulk requests, copy-limited holds on Session
// streams or unary leases) over gRPC (with health and reflection), the HTTP endpoints /healthcheck and
// /json, the debug endpoints /metrics, /rlconfig and pprof, and the config
// directory watcher that swaps a new configuration in atomically.
//
// The server reads no clock for decisions and holds no rate state: it converts
// protos to engine requests and back, counts, and logs. Errors from the engine
// reach gRPC through one function, grpcError.
package server
