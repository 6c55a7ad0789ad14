package charon

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"

	"github.com/charonlimit/charon/copylog"
	"github.com/charonlimit/charon/internal/engine"
)

// charonMetrics are the charon.v1 service's collectors. The resource label
// is a configured resource path (the copy log's name), so its values are
// bounded by the configuration, never by traffic.
type charonMetrics struct {
	calls        *prometheus.CounterVec
	reservations *prometheus.CounterVec
	requests     *prometheus.CounterVec
	// leaseExpiries counts holds whose lease lapsed, transferExpiries
	// staged transfers whose ttl lapsed, both as reaped by operations.
	leaseExpiries, transferExpiries prometheus.Counter
	reapedCopies                    prometheus.Counter
	// sessionReleased counts holds released because their stream ended.
	sessionReleased prometheus.Counter
	sessions        prometheus.Gauge

	mu       sync.RWMutex
	reserveC map[string][2]prometheus.Counter // resource -> granted, rejected
}

func newCharonMetrics(reg *prometheus.Registry, holds func() float64) *charonMetrics {
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "charon", Subsystem: "copies", Name: name, Help: help})
	}
	m := &charonMetrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "charon", Subsystem: "v1", Name: "calls_total",
			Help: "charon.v1 operations (unary or on a Session stream) by method and gRPC code.",
		}, []string{"method", "code"}),
		reservations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "charon", Subsystem: "copies", Name: "reservations_total",
			Help: "Reserves answered, by copy-limited resource and result (granted or rejected).",
		}, []string{"resource", "result"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "charon", Subsystem: "v1", Name: "bulk_requests_total",
			Help: "Bulk Requests answered, by rate-limited resource and result (granted or rejected).",
		}, []string{"resource", "result"}),
		leaseExpiries:    counter("lease_expiries_total", "Holds released because their lease lapsed (reaped by an operation on their resource)."),
		transferExpiries: counter("transfer_expiries_total", "Staged transfers released because their ttl lapsed unseized."),
		reapedCopies:     counter("reaped_copies_total", "Copies released by reaping lapsed holds and transfers."),
		sessionReleased:  counter("session_released_holds_total", "Holds released because their Session stream ended."),
		sessions: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "charon", Subsystem: "v1", Name: "sessions",
			Help: "Open Session streams.",
		}),
		reserveC: make(map[string][2]prometheus.Counter),
	}
	reg.MustRegister(m.calls, m.reservations, m.requests, m.leaseExpiries, m.transferExpiries, m.reapedCopies, m.sessionReleased, m.sessions)
	if holds != nil {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "charon", Subsystem: "copies", Name: "held",
			Help: "Copies held (holds and staged transfers) in the copy store.",
		}, holds))
	}
	return m
}

func (m *charonMetrics) call(method string, code codes.Code) {
	m.calls.WithLabelValues(method, code.String()).Inc()
}

// reserved counts a reserve's answer.
func (m *charonMetrics) reserved(resource string, ok bool) {
	m.mu.RLock()
	c, found := m.reserveC[resource]
	m.mu.RUnlock()
	if !found {
		c = [2]prometheus.Counter{m.reservations.WithLabelValues(resource, "granted"), m.reservations.WithLabelValues(resource, "rejected")}
		m.mu.Lock()
		m.reserveC[resource] = c
		m.mu.Unlock()
	}
	if ok {
		c[0].Inc()
	} else {
		c[1].Inc()
	}
}

// requested counts a bulk request's answer; unlimited resources are not
// counted (an unconfigured one has no bounded name).
func (m *charonMetrics) requested(r engine.Result) {
	if r.Unlimited || r.Match.Resource == "" {
		return
	}
	result := "granted"
	if !r.Decision.OK {
		result = "rejected"
	}
	m.requests.WithLabelValues(r.Match.Resource, result).Inc()
}

// reaped counts what an operation's reaping released.
func (m *charonMetrics) reaped(r copylog.Reaped) {
	if r.Holds > 0 {
		m.leaseExpiries.Add(float64(r.Holds))
	}
	if r.Transfers > 0 {
		m.transferExpiries.Add(float64(r.Transfers))
	}
	if r.Copies > 0 {
		m.reapedCopies.Add(float64(r.Copies))
	}
}
