package rls

import (
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/charonlimit/charon/server"
)

// lyftMetrics are envoyproxy/ratelimit's Prometheus metrics, with the names
// and labels its statsd mapping (default_mapper.yaml) gives them, so that
// its dashboards and alerts keep working: per descriptor
// ratelimit_service_rate_limit_{total_hits,over_limit,near_limit,
// within_limit,shadow_mode}{domain,key1,key2}, and the service's calls,
// errors, response time and configuration loads.
type lyftMetrics struct {
	hitVecs

	requests   prometheus.Counter
	errors     *prometheus.CounterVec
	latency    prometheus.Observer
	loadOK     prometheus.Counter
	loadFailed prometheus.Counter
	// globalShadow is envoyproxy/ratelimit's global_shadow_mode stat, which
	// its mapping leaves unmapped: statsd_exporter names it after the stat.
	globalShadow prometheus.Counter
}

// LyftNames adds envoyproxy/ratelimit's metric names beside Charon's
// (Options.LyftMetrics). Call it before the service serves.
func (m *metrics) LyftNames() error {
	vec := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_service_rate_limit_" + name, Help: help + " (envoyproxy/ratelimit's name)",
		}, []string{"domain", "key1", "key2"})
	}
	l := &lyftMetrics{
		hitVecs: newHitVecs(vec, "Hits granted near the limit.", "Hits granted by shadow mode."),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_service_should_rate_limit_error", Help: "Failed ShouldRateLimit calls by error type (envoyproxy/ratelimit's name).",
		}, []string{"err_type"}),
	}
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratelimit_service_total_requests", Help: "ShouldRateLimit calls (envoyproxy/ratelimit's name).",
	}, []string{"grpc_method"})
	latency := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "ratelimit_service_response_time_seconds", Help: "ShouldRateLimit time (envoyproxy/ratelimit's name).",
		Buckets: []float64{25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 20e-3, 50e-3},
	}, []string{"grpc_method"})
	loadOK := prometheus.NewCounter(prometheus.CounterOpts{Name: "ratelimit_service_config_load_success", Help: "Configuration loads that succeeded (envoyproxy/ratelimit's name)."})
	loadFailed := prometheus.NewCounter(prometheus.CounterOpts{Name: "ratelimit_service_config_load_error", Help: "Configuration loads that failed (envoyproxy/ratelimit's name)."})
	l.requests = requests.WithLabelValues("ShouldRateLimit")
	l.latency = latency.WithLabelValues("ShouldRateLimit")
	l.loadOK, l.loadFailed = loadOK, loadFailed
	l.globalShadow = prometheus.NewCounter(prometheus.CounterOpts{Name: "ratelimit_service_global_shadow_mode",
		Help: "Requests answered OK by SHADOW_MODE that would have been OVER_LIMIT (envoyproxy/ratelimit's name)."})
	for _, c := range append(l.collectors(), l.errors, requests, latency, loadOK, loadFailed, l.globalShadow) {
		if err := m.reg.Register(c); err != nil {
			return err
		}
	}
	m.mu.Lock()
	m.lyft.Store(l)
	clear(m.descs) // counters made before now lack their Lyft children
	m.mu.Unlock()
	return nil
}

// ipv4 is the pattern of an IPv4 address in a stat key (envoyproxy/ratelimit's
// utils.ipv4Regex).
var ipv4 = regexp.MustCompile(`\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}`)

// statReplacer writes '_' for the bytes a statsd line cannot carry in a name:
// ':' and '|' (envoyproxy/ratelimit's utils.SanitizeStatName) and line breaks,
// which would start a line of the client's choosing.
var statReplacer = strings.NewReplacer(":", "_", "|", "_", "\n", "_", "\r", "_")

// statKey is the stat key of a descriptor's metric key as envoyproxy/ratelimit
// names its stats (SanitizeStatName): ':' and '|' written '_', and the dots
// of an IPv4 address too, so that an address (remote_address_10.0.0.1, or
// Envoy Gateway's masked_remote_address_0.0.0.0/0) stays one level of the
// name and one label of its mapping. Line breaks are written '_' as well and
// bytes that are not UTF-8 %XX, so that every sink (a statsd line, a
// Prometheus label) carries the name as it is.
func statKey(key string) string {
	key = statReplacer.Replace(server.ValidLabel(key))
	if strings.Count(key, ".") < 3 {
		return key
	}
	return ipv4.ReplaceAllStringFunc(key, func(ip string) string { return strings.ReplaceAll(ip, ".", "_") })
}

// lyftLabels splits a stat key (domain.key1.key2...) as the mapping does:
// the domain, the first two key levels, the rest dropped.
func lyftLabels(statKey string) [3]string {
	var out [3]string
	parts := strings.SplitN(statKey, ".", 4)
	copy(out[:], parts)
	return out
}

func (l *lyftMetrics) observe(d time.Duration, err error) {
	l.requests.Inc()
	l.latency.Observe(d.Seconds())
	if err == nil {
		return
	}
	// Its two error types: a bad request, and the backend failing.
	if status.Code(err) == codes.InvalidArgument {
		l.errors.WithLabelValues("service_error").Inc()
	} else {
		l.errors.WithLabelValues("redis_error").Inc()
	}
}

// StatsSink receives envoyproxy/ratelimit's statsd stats (package
// internal/statsd sends them).
type StatsSink interface {
	Count(name string, n int64)
	Timing(name string, d time.Duration)
}

// sinks sends every stat to each of its sinks.
type sinks []StatsSink

func (ss sinks) Count(name string, n int64) {
	for _, s := range ss {
		s.Count(name, n)
	}
}

func (ss sinks) Timing(name string, d time.Duration) {
	for _, s := range ss {
		s.Timing(name, d)
	}
}

// MappedStats makes Prometheus series of the statsd stats it receives, as a
// statsd_exporter would; *statsmap.Sink implements it.
type MappedStats interface {
	StatsSink
	prometheus.Gatherer
}

// statNames are the per-descriptor stats, in descCounters order.
var statNames = [5]string{"total_hits", "over_limit", "near_limit", "within_limit", "shadow_mode"}

type statsOut struct {
	sink     StatsSink
	notFound notFoundNames
}

// maxNotFoundDomains bounds the domains named in domain_not_found stats: the
// domain comes from requests, so past the bound it is named "~other".
const maxNotFoundDomains = 256

// notFoundNames are the names of the domain_not_found stats of unknown
// domains, ratelimit.service.rate_limit.DOMAIN.domain_not_found, for at most
// maxNotFoundDomains domains. The zero value is ready; safe for concurrent
// use.
type notFoundNames struct {
	seen sync.Map // domain -> name
	n    atomic.Int32
}

func (f *notFoundNames) name(domain string) string {
	if v, ok := f.seen.Load(domain); ok {
		return v.(string)
	}
	// Past the bound nothing more is kept: the domain comes from requests,
	// so neither the map nor the count may grow with them.
	if f.n.Load() >= maxNotFoundDomains || f.n.Add(1) > maxNotFoundDomains {
		return otherNotFound
	}
	v, _ := f.seen.LoadOrStore(domain, "ratelimit.service.rate_limit."+statKey(domain)+".domain_not_found")
	return v.(string)
}

// otherNotFound is the domain_not_found stat of the domains past the bound.
var otherNotFound = "ratelimit.service.rate_limit." + statKey("~other") + ".domain_not_found"

// SendStats sends envoyproxy/ratelimit's statsd stats to sink, with its
// names: ratelimit.service.rate_limit.STATKEY.{total_hits,over_limit,
// near_limit,within_limit,shadow_mode}, ratelimit_server.ShouldRateLimit.
// {total_requests,response_time}, ratelimit.service.call.should_rate_limit.
// {service_error,redis_error}, ratelimit.service.config_load_{success,error},
// ratelimit.service.global_shadow_mode and ratelimit.service.rate_limit.
// DOMAIN.domain_not_found. Call it before the server serves.
// Called again, it sends to every sink it was given.
func (m *metrics) SendStats(sink StatsSink) {
	m.mu.Lock()
	if so := m.stats.Load(); so != nil {
		sink = sinks{so.sink, sink}
	}
	m.stats.Store(&statsOut{sink: sink})
	clear(m.descs) // counters made before now lack their stat names
	m.mu.Unlock()
}

func (o *statsOut) observe(d time.Duration, err error) {
	o.sink.Count("ratelimit_server.ShouldRateLimit.total_requests", 1)
	o.sink.Timing("ratelimit_server.ShouldRateLimit.response_time", d)
	if err == nil {
		return
	}
	if status.Code(err) == codes.InvalidArgument {
		o.sink.Count("ratelimit.service.call.should_rate_limit.service_error", 1)
	} else {
		o.sink.Count("ratelimit.service.call.should_rate_limit.redis_error", 1)
	}
}
