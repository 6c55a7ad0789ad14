package server

import (
	"fmt"
	"runtime/metrics"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/charonlimit/charon/internal/engine"
)

// Metrics are the server's Prometheus collectors, registered in their own
// registry. Safe for concurrent use. Use NewMetrics; the zero value is not
// usable.
type Metrics struct {
	// Registry holds every collector below; /metrics serves it.
	Registry *prometheus.Registry
	// quota counts the answers of descriptors with a calendar quota.
	quota *quotaMetrics

	hitVecs

	reloads         *prometheus.CounterVec
	reloadOK        prometheus.Counter
	reloadFailed    prometheus.Counter
	versionInfo     *prometheus.GaugeVec
	invalidRequests prometheus.Counter
	requestErrors   prometheus.Counter
	globalShadow    prometheus.Counter
	nearRatio       float64
	authzDenied     *prometheus.CounterVec
	debugDenied     prometheus.Counter
	latency         prometheus.Observer
	unconfigured    *unconfigured

	mu    sync.RWMutex
	descs map[descKey]*descCounters
	lyft  atomic.Pointer[lyftMetrics] // nil: only Charon's names (LyftNames)
	stats atomic.Pointer[statsOut]    // nil: no statsd stats (SendStats)
	// mapped, under mu, makes series of the stats (nil: none, MapStats).
	mapped prometheus.Gatherer
}

type descKey struct{ domain, key string }

// descCounters caches the children of one (domain, key) so the hot path does
// not hash label values.
type descCounters struct {
	total, over, near, within, shadow prometheus.Counter
	// lyft are the same under envoyproxy/ratelimit's names (nil without
	// LyftNames), stats its statsd stat names (nil without SendStats).
	lyft  *[5]prometheus.Counter
	stats *[5]string
	sink  StatsSink
}

func (c *descCounters) add(i int, main prometheus.Counter, n float64) {
	main.Add(n)
	if c.lyft != nil {
		c.lyft[i].Add(n)
	}
	if c.stats != nil {
		c.sink.Count(c.stats[i], int64(n))
	}
}

// hitVecs count the hits of matched descriptors by outcome, under Charon's
// names or envoyproxy/ratelimit's.
type hitVecs struct {
	totalHits, overLimit, nearLimit, withinLimit, shadowMode *prometheus.CounterVec
}

// newHitVecs makes the five counters with vec; near and shadow are the help
// of near_limit and shadow_mode, which each naming words its own way.
func newHitVecs(vec func(name, help string) *prometheus.CounterVec, near, shadow string) hitVecs {
	return hitVecs{
		totalHits:   vec("total_hits", "Hits asked for by matched descriptors."),
		overLimit:   vec("over_limit", "Hits of matched descriptors answered OVER_LIMIT."),
		nearLimit:   vec("near_limit", near),
		withinLimit: vec("within_limit", "Hits of matched descriptors granted."),
		shadowMode:  vec("shadow_mode", shadow),
	}
}

func (h *hitVecs) collectors() []prometheus.Collector {
	return []prometheus.Collector{h.totalHits, h.overLimit, h.nearLimit, h.withinLimit, h.shadowMode}
}

// NewMetrics builds the collectors in a new registry. evictions, when not
// nil, reports the store's evicted-pair count.
func NewMetrics(evictions func() float64) *Metrics {
	reg := prometheus.NewRegistry()
	vec := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "charon", Subsystem: "rate_limit", Name: name, Help: help,
		}, []string{"domain", "key"})
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "charon", Name: name, Help: help})
	}
	counterVec := func(name, help, label string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "charon", Name: name, Help: help}, []string{label})
	}
	m := &Metrics{
		Registry: reg,
		hitVecs: newHitVecs(vec, "Hits granted while at least the near-limit ratio (0.8) of the current limit was used.",
			"Hits that would have been refused but were granted by shadow_mode or ignore_limits."),
		reloads: counterVec("config_reloads_total", "Configuration loads by result (success or failure).", "result"),
		versionInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "charon", Name: "config_version_info",
			Help: "1, labelled with the source (xds) and version of the configuration in force; absent with files."},
			[]string{"source", "version"}),
		invalidRequests: counter("invalid_requests_total", "Requests refused with InvalidArgument."),
		requestErrors:   counter("request_errors_total", "Requests answered with a gRPC error other than InvalidArgument."),
		authzDenied: counterVec("authz_denied_total",
			"gRPC calls refused with PERMISSION_DENIED by the authorization table, by method group.", "group"),
		debugDenied:  counter("debug_denied_total", "Debug port requests refused for a missing or wrong bearer token."),
		globalShadow: counter("global_shadow_mode_total", "Requests answered OK by --shadow-mode that would have been OVER_LIMIT."),
		nearRatio:    0.8,
		descs:        make(map[descKey]*descCounters),
		unconfigured: newUnconfigured(),
	}
	hist := prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: "charon", Name: "request_duration_seconds",
		Help:    "ShouldRateLimit latency inside the server.",
		Buckets: []float64{25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 20e-3, 50e-3},
	})
	m.latency = hist
	m.reloadOK = m.reloads.WithLabelValues("success")
	m.reloadFailed = m.reloads.WithLabelValues("failure")
	m.quota = newQuotaMetrics(reg)
	reg.MustRegister(m.collectors()...)
	reg.MustRegister(m.reloads, m.versionInfo, m.invalidRequests, m.requestErrors, m.authzDenied, m.debugDenied, m.globalShadow, hist, m.unconfigured.vec,
		prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}), gcCPUFraction())
	if evictions != nil {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "charon", Name: "store_evictions_total",
			Help: "Tracked (resource, domain) pairs evicted by the store's --max-keys bound.",
		}, evictions))
	}
	return m
}

// StateFileWrites exports the state file's snapshots as
// charon_state_file_writes_total{outcome="written"|"failed"}, from the
// counts written and failed return.
func (m *Metrics) StateFileWrites(written, failed func() uint64) {
	for outcome, f := range map[string]func() uint64{"written": written, "failed": failed} {
		m.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "charon", Name: "state_file_writes_total",
			Help:        "Snapshots of the memory store's counts written to --state-file, by outcome (written, failed).",
			ConstLabels: prometheus.Labels{"outcome": outcome},
		}, func() float64 { return float64(f()) }))
	}
}

func (m *Metrics) observeRequest(d time.Duration, err error) {
	m.latency.Observe(d.Seconds())
	if so := m.stats.Load(); so != nil {
		so.observe(d, err)
	}
	if l := m.lyftNames(); l != nil {
		l.observe(d, err)
	}
	if err == nil {
		return
	}
	if status.Code(err) == codes.InvalidArgument {
		m.invalidRequests.Inc()
	} else {
		m.requestErrors.Inc()
	}
}

// globalShadowed counts a request answered OK by --shadow-mode that would
// have been OVER_LIMIT.
func (m *Metrics) globalShadowed() {
	m.globalShadow.Inc()
	if so := m.stats.Load(); so != nil {
		so.sink.Count("ratelimit.service.global_shadow_mode", 1)
	}
	if l := m.lyftNames(); l != nil {
		l.globalShadow.Inc()
	}
}

func (m *Metrics) reloaded(ok bool) {
	l := m.lyftNames()
	if so := m.stats.Load(); so != nil {
		if ok {
			so.sink.Count("ratelimit.service.config_load_success", 1)
		} else {
			so.sink.Count("ratelimit.service.config_load_error", 1)
		}
	}
	if ok {
		m.reloadOK.Inc()
		if l != nil {
			l.loadOK.Inc()
		}
	} else {
		m.reloadFailed.Inc()
		if l != nil {
			l.loadFailed.Inc()
		}
	}
}

// configVersion makes version of source the one series of
// charon_config_version_info.
func (m *Metrics) configVersion(source, version string) {
	m.versionInfo.Reset()
	m.versionInfo.WithLabelValues(source, validLabel(version)).Set(1)
}

func (m *Metrics) lyftNames() *lyftMetrics { return m.lyft.Load() }

func (m *Metrics) counters(domain, key string) *descCounters {
	k := descKey{domain, key}
	m.mu.RLock()
	c := m.descs[k]
	m.mu.RUnlock()
	if c != nil {
		return c
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if c = m.descs[k]; c == nil {
		// Label values must be UTF-8: request bytes that are not (a
		// detailed_metric value) are written %XX.
		domain, key := validLabel(domain), validLabel(key)
		c = &descCounters{
			total:  m.totalHits.WithLabelValues(domain, key),
			over:   m.overLimit.WithLabelValues(domain, key),
			near:   m.nearLimit.WithLabelValues(domain, key),
			within: m.withinLimit.WithLabelValues(domain, key),
			shadow: m.shadowMode.WithLabelValues(domain, key),
		}
		sk := statKey(k.key)
		if so := m.stats.Load(); so != nil {
			c.sink = so.sink
			c.stats = &[5]string{}
			for i, n := range statNames {
				c.stats[i] = "ratelimit.service.rate_limit." + sk + "." + n
			}
		}
		if l := m.lyft.Load(); l != nil {
			ll := lyftLabels(sk)
			c.lyft = &[5]prometheus.Counter{
				l.totalHits.WithLabelValues(ll[:]...), l.overLimit.WithLabelValues(ll[:]...), l.nearLimit.WithLabelValues(ll[:]...),
				l.withinLimit.WithLabelValues(ll[:]...), l.shadowMode.WithLabelValues(ll[:]...),
			}
		}
		m.descs[k] = c
	}
	return c
}

// countDescriptors counts the hits of every matched descriptor. The key label
// is the config's metric key (values only with detailed_metric), so the label
// set is bounded by the configuration, not by traffic.
func (m *Metrics) countDescriptors(req *engine.Request, resp *engine.Response) {
	if resp.UnknownDomain {
		if so := m.stats.Load(); so != nil {
			// Once per descriptor, as envoyproxy/ratelimit looks each one up.
			so.sink.Count(so.notFound.name(req.Domain), int64(len(req.Descriptors)))
		}
		return
	}
	m.quota.count(req, resp)
	for i := range resp.Statuses {
		st := &resp.Statuses[i]
		if st.Unconfigured && i < len(req.Descriptors) && len(req.Descriptors[i].Entries) > 0 {
			m.unconfigured.add(req.Domain, req.Descriptors[i].Entries[0].Key, float64(descriptorHits(req, i)))
			continue
		}
		if st.Match.Limit == nil || st.Match.MetricKey == "" || i >= len(req.Descriptors) || req.Descriptors[i].Refund {
			continue
		}
		hits := float64(descriptorHits(req, i))
		c := m.counters(req.Domain, st.Match.MetricKey)
		c.add(0, c.total, hits)
		if st.Shadow {
			c.add(4, c.shadow, hits)
		}
		if st.Code == engine.CodeOverLimit {
			c.add(1, c.over, hits)
			continue
		}
		c.add(3, c.within, hits)
		if l := st.Limit; l != nil && l.RequestsPerUnit > 0 &&
			float64(l.RequestsPerUnit-min(st.Remaining, l.RequestsPerUnit)) >= m.nearRatio*float64(l.RequestsPerUnit) {
			c.add(2, c.near, hits)
		}
	}
}

// descriptorHits is the number of hits descriptor i asked for.
func descriptorHits(req *engine.Request, i int) uint64 {
	d := &req.Descriptors[i]
	if d.HasHits {
		return d.Hits
	}
	if req.Hits == 0 {
		return 1
	}
	return uint64(req.Hits)
}

// gcCPUFraction is go_memstats_gc_cpu_fraction, the share of the CPU time
// available to the process (GOMAXPROCS) that the garbage collector used since
// it started, which the Go collector no longer exports and Envoy Gateway's
// ratelimit dashboard still charts. It is read from runtime/metrics, so that
// a scrape does not stop the world as runtime.ReadMemStats would.
func gcCPUFraction() prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "go_memstats_gc_cpu_fraction",
		Help: "The fraction of this program's available CPU time used by the GC since the program started.",
	}, func() float64 {
		s := []metrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}, {Name: "/cpu/classes/total:cpu-seconds"}}
		metrics.Read(s)
		if s[0].Value.Kind() != metrics.KindFloat64 || s[1].Value.Kind() != metrics.KindFloat64 || s[1].Value.Float64() <= 0 {
			return 0
		}
		return s[0].Value.Float64() / s[1].Value.Float64()
	})
}

// validLabel returns s with every byte that is not part of valid UTF-8
// written %XX.
func validLabel(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			fmt.Fprintf(&b, "%%%02X", s[i])
		} else {
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}
