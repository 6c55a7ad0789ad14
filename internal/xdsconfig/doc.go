// Package xdsconfig takes the rate limit configuration from an xDS
// management server instead of a directory: the State of the World
// Aggregated Discovery Service
// (envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources)
// of envoyproxy/ratelimit's RateLimitConfig resources, as envoyproxy/ratelimit
// fetches them with CONFIG_TYPE=GRPC_XDS_SOTW.
//
// Each response is the whole configuration. It is judged as a whole, like a
// reload of files: every RateLimitConfig is written as a file of
// envoyproxy/ratelimit's YAML, named after the resource, and the files are
// loaded together by the caller's loader (config.Load), so the same rules
// hold whatever the source. A valid response is applied and ACKed; an
// invalid one is NACKed with its problems, each naming the resource, its
// domain and the descriptor, and the configuration in force stays.
//
// A server may send a rejected configuration straight back (go-control-plane's
// snapshot cache does, since the NACK names an older version). Resources are
// identified by a hash of their bytes: the ones last rejected are not
// validated again, and NACKs are sent at most once per NACKDelay, so such a
// server is answered at that pace rather than in a loop, and a corrected
// configuration is taken at the latest NACKDelay after it is published.
// Resources equal to those in force are not loaded again either.
//
// A stream that cannot be opened or breaks is opened again after a
// Backoff (envoyproxy/ratelimit's XDS_CLIENT_BACKOFF_* settings), on a new
// connection whose TLS configuration is built anew, so that rotated
// certificate files are read; the configuration in force stays meanwhile.
//
// Time, timers and random draws are Options, so that tests control them.
package xdsconfig
