// Package statsmap makes Prometheus series of envoyproxy/ratelimit's statsd
// stats through a statsd_exporter mapping file, as envoyproxy/ratelimit does
// with USE_PROMETHEUS and PROMETHEUS_MAPPER_YAML (Envoy Gateway's deployment
// sets both).
//
// The stats are handed, as statsd events, to statsd_exporter's own exporter,
// mapper and registry (github.com/prometheus/statsd_exporter/pkg/...), the
// code envoyproxy/ratelimit feeds: a mapping means here exactly what it means
// there (globs and regular expressions, labels, timer_type, scale, drop,
// ttl, the names statsd_exporter gives unmapped stats), with none of it
// written again.
//
// Counting must not wait on that exporter, which handles events one at a
// time on its own goroutine. A Sink adds counts up by stat name and keeps
// timings until the next scrape (or until maxPending of them wait), then
// hands them over in one batch; a scrape waits until its batch is handled,
// so it sees every stat counted before it began.
package statsmap
