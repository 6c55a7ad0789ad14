package rls

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/decisionlog"
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/internal/offenders"
	"github.com/charonlimit/charon/server"
)

// maxUnconfiguredKeys bounds the (domain, key) label pairs of
// charon_unconfigured_hits_total: the key comes from requests, so past the
// bound the key is counted as "~other".
const maxUnconfiguredKeys = 256

// unconfigured counts the hits of requests granted because they matched
// nothing in a domain with allow_unconfigured (paper §4.3), per RLS domain
// and top-level key, so a first limit can be chosen from data.
type unconfigured struct {
	vec  *prometheus.CounterVec
	seen sync.Map // descKey -> prometheus.Counter
	n    atomic.Int32
}

func newUnconfigured() *unconfigured {
	return &unconfigured{vec: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "charon", Name: "unconfigured_hits_total",
		Help: "Hits granted because they matched no descriptor of a domain with allow_unconfigured, by RLS domain and top-level key (at most 256 pairs; then key ~other).",
	}, []string{"domain", "key"})}
}

func (u *unconfigured) add(domain, key string, hits float64) {
	k := descKey{domain, key}
	c, ok := u.seen.Load(k)
	if !ok {
		if u.n.Add(1) > maxUnconfiguredKeys {
			k.key = "~other"
		}
		c, _ = u.seen.LoadOrStore(k, u.vec.WithLabelValues(server.ValidLabel(k.domain), server.ValidLabel(k.key)))
	}
	c.(prometheus.Counter).Add(hits)
}

// decisionLogCollector exports a decision log's counts.
func decisionLogCollector(reg prometheus.Registerer, l *decisionlog.Logger) error {
	for _, c := range []struct {
		what string
		f    func(decisionlog.Stats) uint64
	}{
		{"written", func(s decisionlog.Stats) uint64 { return s.Written }},
		{"dropped_rate", func(s decisionlog.Stats) uint64 { return s.DroppedRate }},
		{"dropped_queue", func(s decisionlog.Stats) uint64 { return s.DroppedQueue }},
		{"write_error", func(s decisionlog.Stats) uint64 { return s.WriteErrors }},
	} {
		if err := reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "charon", Name: "decision_log_lines_total",
			Help:        "Decision log lines by outcome: written, dropped by the rate bound or a full queue, failed to write.",
			ConstLabels: prometheus.Labels{"outcome": c.what},
		}, func() float64 { return float64(c.f(l.Stats())) })); err != nil {
			return err
		}
	}
	return nil
}

// logDecisions writes the kept lines of a decided request to the decision
// log: every rejection (shadow ones too) and burst, a sample of the rest;
// of a complete log (--decision-log-all), every descriptor.
func logDecisions(l *decisionlog.Logger, now time.Time, req *engine.Request, resp *engine.Response) {
	all := l.All()
	var id string
	if all {
		// A complete log keeps a request whole or drops it whole (the rate
		// bound counts requests then): replay finds a dropped request as a
		// gap in the numbering, never a request missing some descriptors.
		id = l.NextRequest()
		if _, ok := l.Keep(true); !ok {
			return
		}
	}
	for i := range resp.Statuses {
		st := &resp.Statuses[i]
		if i >= len(req.Descriptors) {
			continue
		}
		notLimited := st.Limit == nil && !st.Unconfigured
		if !all && (req.Descriptors[i].Refund || notLimited) {
			continue
		}
		d := &st.Decision
		important := st.Code == engine.CodeOverLimit || st.Shadow || d.Burst
		weight, ok := 1.0, true
		if !all {
			weight, ok = l.Keep(important)
		}
		if !ok {
			continue
		}
		if id == "" {
			id = l.NextRequest()
		}
		hits := int64(descriptorHits(req, i))
		r := &decisionlog.Record{
			Time: now, RLSDomain: req.Domain, Resource: st.Match.Resource, Domain: st.Match.Domain,
			Hits: hits, Tier: d.Tier, Burst: d.Burst, Weight: weight, Result: decisionlog.ResultGranted,
			Request: id, OverLimit: resp.Code == engine.CodeOverLimit, Refund: req.Descriptors[i].Refund, Complete: all,
		}
		if o := req.Descriptors[i].Override; o != nil {
			r.Override = &decisionlog.Override{RequestsPerUnit: o.RequestsPerUnit, Unit: o.Unit.String(), Multiplier: o.Multiplier}
		}
		if !st.PeriodEnd.IsZero() {
			r.PeriodEnd = st.PeriodEnd.UTC()
		}
		if d.Leased {
			r.Escrow = decisionlog.EscrowLocal
		}
		es := req.Descriptors[i].Entries
		r.Entries = make([]decisionlog.Entry, len(es))
		for j, e := range es {
			r.Entries[j] = decisionlog.Entry{Key: descriptors.Truncate(e.Key), Value: descriptors.Truncate(e.Value)}
		}
		switch {
		case notLimited:
			r.Result, r.Granted = decisionlog.ResultNotLimited, hits
		case st.Unconfigured:
			r.Result, r.Granted = decisionlog.ResultUnconfigured, hits
		case st.Code == engine.CodeOverLimit || st.Shadow:
			r.Result = decisionlog.ResultRejected
			if st.Shadow {
				r.Result = decisionlog.ResultShadow
			}
			r.LimitedBy = d.Limiter()
			if st.By == engine.ByQuota {
				r.LimitedBy = "quota"
			}
		case resp.Code == engine.CodeOK:
			// Granted hits were committed only when the request was.
			r.Granted = d.Granted
		}
		l.Log(r)
	}
}

// observeOffenders counts the hits of every limited descriptor of a decided
// request in the tracker, by rule and value (the pair's Charon domain):
// rejected, shadow, or granted when the request was (otherwise nothing was
// committed).
func observeOffenders(t *offenders.Tracker, now time.Time, req *engine.Request, resp *engine.Response) {
	for i := range resp.Statuses {
		st := &resp.Statuses[i]
		if st.Limit == nil || st.Match.Limit == nil || i >= len(req.Descriptors) || req.Descriptors[i].Refund {
			continue
		}
		o := offenders.Granted
		switch {
		case st.Shadow:
			o = offenders.Shadow
		case st.Code == engine.CodeOverLimit:
			o = offenders.Rejected
		case resp.Code != engine.CodeOK:
			continue
		}
		t.Observe(now, req.Domain, st.Match.Limit, st.Match.Resource, st.Match.Domain, req.Descriptors[i].Entries, descriptorHits(req, i), o)
	}
}
