package rls

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/server"
)

// metrics are the RLS service's collectors, registered in the server's
// registry: per matched descriptor, its hits by outcome, under Charon's
// names and, with LyftNames, envoyproxy/ratelimit's (or as its statsd
// stats, SendStats); the calls' latency and errors; global shadow mode;
// unconfigured hits; calendar quotas. Safe for concurrent use. Use
// newMetrics.
type metrics struct {
	// reg is the server's registry.
	reg prometheus.Registerer
	// quota counts the answers of descriptors with a calendar quota.
	quota *quotaMetrics

	hitVecs

	invalidRequests prometheus.Counter
	requestErrors   prometheus.Counter
	globalShadow    prometheus.Counter
	nearRatio       float64
	latency         prometheus.Observer
	unconfigured    *unconfigured

	mu    sync.RWMutex
	descs map[descKey]*descCounters
	lyft  atomic.Pointer[lyftMetrics] // nil: only Charon's names (LyftNames)
	stats atomic.Pointer[statsOut]    // nil: no statsd stats (SendStats)
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

// newMetrics builds the collectors and registers them in reg.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	vec := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "charon", Subsystem: "rate_limit", Name: name, Help: help,
		}, []string{"domain", "key"})
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "charon", Name: name, Help: help})
	}
	m := &metrics{
		reg: reg,
		hitVecs: newHitVecs(vec, "Hits granted while at least the near-limit ratio (0.8) of the current limit was used.",
			"Hits that would have been refused but were granted by shadow_mode or ignore_limits."),
		invalidRequests: counter("invalid_requests_total", "Requests refused with InvalidArgument."),
		requestErrors:   counter("request_errors_total", "Requests answered with a gRPC error other than InvalidArgument."),
		globalShadow:    counter("global_shadow_mode_total", "Requests answered OK by --shadow-mode that would have been OVER_LIMIT."),
		nearRatio:       0.8,
		descs:           make(map[descKey]*descCounters),
		unconfigured:    newUnconfigured(),
	}
	hist := prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: "charon", Name: "request_duration_seconds",
		Help:    "ShouldRateLimit latency inside the server.",
		Buckets: []float64{25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 20e-3, 50e-3},
	})
	m.latency = hist
	var err error
	if m.quota, err = newQuotaMetrics(reg); err != nil {
		return nil, err
	}
	for _, c := range append(m.collectors(), m.invalidRequests, m.requestErrors, m.globalShadow, hist, m.unconfigured.vec) {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *metrics) observeRequest(d time.Duration, err error) {
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
func (m *metrics) globalShadowed() {
	m.globalShadow.Inc()
	if so := m.stats.Load(); so != nil {
		so.sink.Count("ratelimit.service.global_shadow_mode", 1)
	}
	if l := m.lyftNames(); l != nil {
		l.globalShadow.Inc()
	}
}

// reloaded counts a configuration load under envoyproxy/ratelimit's names
// (server.Metrics.OnReload), when they are on.
func (m *metrics) reloaded(ok bool) {
	l := m.lyftNames()
	if so := m.stats.Load(); so != nil {
		if ok {
			so.sink.Count("ratelimit.service.config_load_success", 1)
		} else {
			so.sink.Count("ratelimit.service.config_load_error", 1)
		}
	}
	if l == nil {
		return
	}
	if ok {
		l.loadOK.Inc()
	} else {
		l.loadFailed.Inc()
	}
}

func (m *metrics) lyftNames() *lyftMetrics { return m.lyft.Load() }

func (m *metrics) counters(domain, key string) *descCounters {
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
		domain, key := server.ValidLabel(domain), server.ValidLabel(key)
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
func (m *metrics) countDescriptors(req *engine.Request, resp *engine.Response) {
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
