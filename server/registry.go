package server

import (
	"fmt"
	"runtime/metrics"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the server's Prometheus registry, which /metrics serves and
// every service registers its collectors in, and the server's own
// collectors: configuration loads, refusals of the authorization table and
// of the debug token, the Go runtime and the process. Safe for concurrent
// use. Use NewMetrics; the zero value is not usable.
type Metrics struct {
	// Registry holds every collector; /metrics serves it.
	Registry *prometheus.Registry

	reloads      *prometheus.CounterVec
	reloadOK     prometheus.Counter
	reloadFailed prometheus.Counter
	versionInfo  *prometheus.GaugeVec
	authzDenied  *prometheus.CounterVec
	debugDenied  prometheus.Counter

	mu sync.RWMutex
	// onReload are told of every configuration load (OnReload).
	onReload []func(ok bool)
	// gatherers serve series beside the registry's (Gather).
	gatherers []prometheus.Gatherer
}

// NewMetrics builds the collectors in a new registry. evictions, when not
// nil, reports the store's evicted-pair count.
func NewMetrics(evictions func() float64) *Metrics {
	reg := prometheus.NewRegistry()
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "charon", Name: name, Help: help})
	}
	counterVec := func(name, help, label string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "charon", Name: name, Help: help}, []string{label})
	}
	m := &Metrics{
		Registry: reg,
		reloads:  counterVec("config_reloads_total", "Configuration loads by result (success or failure).", "result"),
		versionInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "charon", Name: "config_version_info",
			Help: "1, labelled with the source (xds) and version of the configuration in force; absent with files."},
			[]string{"source", "version"}),
		authzDenied: counterVec("authz_denied_total",
			"gRPC calls refused with PERMISSION_DENIED by the authorization table, by method group.", "group"),
		debugDenied: counter("debug_denied_total", "Debug port requests refused for a missing or wrong bearer token."),
	}
	m.reloadOK = m.reloads.WithLabelValues("success")
	m.reloadFailed = m.reloads.WithLabelValues("failure")
	reg.MustRegister(m.reloads, m.versionInfo, m.authzDenied, m.debugDenied,
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

// OnReload has f told of every configuration load from now on, with its
// result, beside charon_config_reloads_total (the RLS service counts them
// under envoyproxy/ratelimit's names too). A Service registers it before
// the server's first load.
func (m *Metrics) OnReload(f func(ok bool)) {
	m.mu.Lock()
	m.onReload = append(m.onReload, f)
	m.mu.Unlock()
}

// Gather serves g's series on /metrics beside the registry's (a
// statsd_exporter mapping's, package statsmap). A series both make is
// served by neither: the scrape leaves it out and logs why.
func (m *Metrics) Gather(g prometheus.Gatherer) {
	m.mu.Lock()
	m.gatherers = append(m.gatherers, g)
	m.mu.Unlock()
}

// gatherer is what /metrics serves: the registry, and the series of Gather.
func (m *Metrics) gatherer() prometheus.Gatherer {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if len(m.gatherers) == 0 {
		return m.Registry
	}
	return append(prometheus.Gatherers{m.Registry}, m.gatherers...)
}

func (m *Metrics) reloaded(ok bool) {
	if ok {
		m.reloadOK.Inc()
	} else {
		m.reloadFailed.Inc()
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	for _, f := range m.onReload {
		f(ok)
	}
}

// configVersion makes version of source the one series of
// charon_config_version_info.
func (m *Metrics) configVersion(source, version string) {
	m.versionInfo.Reset()
	m.versionInfo.WithLabelValues(source, ValidLabel(version)).Set(1)
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

// ValidLabel returns s with every byte that is not part of valid UTF-8
// written %XX: a label value (and a protobuf string) must be UTF-8, and
// request bytes need not be.
func ValidLabel(s string) string {
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
