// Package canary decides every request a second time under a candidate
// configuration, in shadow: the candidate has its own engine over its own
// memory store (its own state, which the live store never sees, whichever
// store serves the live answers), it reads the live answer and never
// changes it, and it counts, per rule of the candidate configuration, how
// often its answer agrees with the live one, and how often it would
// reject what was granted or grant what was rejected.
//
// The counts go to Prometheus (Collector), to a debug endpoint (ServeHTTP)
// and the candidate's pairs can be explained as the live ones are
// (Explain). The rule label set is bounded by the candidate configuration:
// rules are named by their configured path, never by request values.
package canary

import (
	"cmp"
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/internal/store/memstore"
)

// Outcomes of a comparison, as the metrics' outcome label says them.
const (
	Agree       = "agree"
	WouldReject = "would_reject" // live granted, the candidate rejects
	WouldGrant  = "would_grant"  // live rejected, the candidate grants
)

// NoRule is the rule of a descriptor the live configuration rejected and
// that no rule of the candidate limits.
const NoRule = "~none"

// Options configure a Canary.
type Options struct {
	// Engine holds the live engine's settings (MaxDescriptors, QuotaMode,
	// FixedWindowOverrides, Overdraft, Now); its Store is the Canary's own.
	Engine engine.Options
	// MaxKeys bounds the pairs of the candidate's memory store, as
	// memstore.Options.MaxKeys.
	MaxKeys int
}

// Canary is a candidate configuration decided in shadow. Safe for
// concurrent use; create it with New and stop it with Close. Before
// SetConfig it decides nothing.
type Canary struct {
	eng   *engine.Engine
	store *memstore.Store
	rules atomic.Pointer[table]
	resp  sync.Pool // *engine.Response

	requests [3]atomic.Uint64 // by outcome
	errors   atomic.Uint64
}

type ruleKey struct{ domain, resource string }

// counts are one rule's counts by outcome.
type counts struct {
	domain, rule, resource string
	n                      [3]atomic.Uint64
}

// table is the candidate configuration's rules.
type table struct {
	cfg   *config.Config
	byKey map[ruleKey]*counts
	list  []*counts // sorted, NoRule last
	none  *counts
}

// New returns a Canary with no configuration.
func New(opts Options) *Canary {
	st := memstore.New(memstore.Options{MaxKeys: opts.MaxKeys})
	eo := opts.Engine
	// The candidate decides beside the live request, which must not wait
	// for it: a paced rule is decided, never held.
	eo.Store, eo.OnSetTree, eo.Sleep = st, nil, engine.NoWait
	c := &Canary{eng: engine.New(eo), store: st}
	c.resp.New = func() any { return new(engine.Response) }
	return c
}

// Close releases the candidate's store.
func (c *Canary) Close() error { return c.store.Close() }

// SetConfig puts cfg in force as the candidate; a rule kept from the
// previous candidate keeps its counts (and, when its limit is unchanged,
// its state, as a reload of the live configuration does).
func (c *Canary) SetConfig(cfg *config.Config) {
	old := c.rules.Load()
	t := &table{cfg: cfg, byKey: map[ruleKey]*counts{}}
	for _, dc := range cfg.Tree.Domains() {
		for _, lf := range cfg.Tree.Leaves(dc.Name) {
			k := ruleKey{dc.Name, lf.Resource}
			rc := &counts{domain: dc.Name, rule: config.PathString(lf.Path), resource: lf.Resource}
			if old != nil && old.byKey[k] != nil {
				rc = old.byKey[k]
			}
			t.byKey[k] = rc
			t.list = append(t.list, rc)
		}
	}
	t.none = &counts{rule: NoRule}
	if old != nil {
		t.none = old.none
	}
	t.list = append(t.list, t.none)
	c.rules.Store(t)
	c.eng.SetTree(cfg.Tree)
}

// Config returns the candidate configuration in force (nil before SetConfig).
func (c *Canary) Config() *config.Config {
	if t := c.rules.Load(); t != nil {
		return t.cfg
	}
	return nil
}

// Observe decides req under the candidate and compares its answer with
// live, the answer req was given. It changes neither; a request the
// candidate cannot decide is counted as an error.
func (c *Canary) Observe(ctx context.Context, req *engine.Request, live *engine.Response) {
	t := c.rules.Load()
	if t == nil || live == nil {
		return
	}
	resp := c.resp.Get().(*engine.Response)
	defer c.resp.Put(resp)
	if err := c.eng.Decide(ctx, req, resp); err != nil || len(resp.Statuses) != len(live.Statuses) {
		c.errors.Add(1)
		return
	}
	c.requests[outcome(live.Code == engine.CodeOverLimit, resp.Code == engine.CodeOverLimit)].Add(1)
	for i := range resp.Statuses {
		cs, ls := &resp.Statuses[i], &live.Statuses[i]
		liveOver, candOver := ls.Code == engine.CodeOverLimit, cs.Code == engine.CodeOverLimit
		var rc *counts
		if cs.Limit != nil {
			rc = t.byKey[ruleKey{req.Domain, cs.Match.Resource}]
		}
		if rc == nil {
			if !liveOver && !candOver {
				continue
			}
			rc = t.none
		}
		rc.n[outcome(liveOver, candOver)].Add(1)
	}
}

func outcome(liveOver, candOver bool) int {
	switch {
	case liveOver == candOver:
		return 0
	case candOver:
		return 1
	}
	return 2
}

var outcomes = [3]string{Agree, WouldReject, WouldGrant}

// Explain explains req under the candidate, as engine.Engine.Explain.
func (c *Canary) Explain(ctx context.Context, req *engine.Request) ([]engine.Explanation, error) {
	return c.eng.Explain(ctx, req)
}

// Reset forgets the candidate's state of req's pairs, as
// engine.Engine.Reset.
func (c *Canary) Reset(ctx context.Context, req *engine.Request) (int, error) {
	return c.eng.Reset(ctx, req)
}

// Outcomes counts comparisons by outcome.
type Outcomes struct {
	Agree       uint64 `json:"agree"`
	WouldReject uint64 `json:"would_reject"`
	WouldGrant  uint64 `json:"would_grant"`
}

// RuleCounts are one rule's counts.
type RuleCounts struct {
	Domain   string `json:"domain"`
	Rule     string `json:"rule"`
	Resource string `json:"resource,omitempty"`
	Outcomes
}

// Report is the counts so far: per request and per rule of the candidate.
type Report struct {
	Files    []string     `json:"files"`
	Requests Outcomes     `json:"requests"`
	Errors   uint64       `json:"errors"`
	Rules    []RuleCounts `json:"rules"`
}

// Report returns the counts so far.
func (c *Canary) Report() Report {
	r := Report{Files: []string{}, Rules: []RuleCounts{}, Errors: c.errors.Load(),
		Requests: Outcomes{Agree: c.requests[0].Load(), WouldReject: c.requests[1].Load(), WouldGrant: c.requests[2].Load()}}
	t := c.rules.Load()
	if t == nil {
		return r
	}
	r.Files = t.cfg.Files
	for _, rc := range t.list {
		r.Rules = append(r.Rules, RuleCounts{Domain: rc.domain, Rule: rc.rule, Resource: rc.resource,
			Outcomes: Outcomes{Agree: rc.n[0].Load(), WouldReject: rc.n[1].Load(), WouldGrant: rc.n[2].Load()}})
	}
	slices.SortStableFunc(r.Rules, func(a, b RuleCounts) int {
		return cmp.Or(cmp.Compare(b2i(a.Rule == NoRule), b2i(b.Rule == NoRule)), strings.Compare(a.Domain, b.Domain), strings.Compare(a.Resource, b.Resource))
	})
	return r
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// ServeHTTP answers the Report as JSON.
func (c *Canary) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(c.Report())
}

var (
	decisionsDesc = prometheus.NewDesc("charon_candidate_decisions_total",
		"Descriptors decided under --candidate-config, by the candidate's rule (~none: rejected live, not limited by the candidate) and outcome: agree, would_reject (granted live), would_grant (rejected live).",
		[]string{"domain", "rule", "outcome"}, nil)
	requestsDesc = prometheus.NewDesc("charon_candidate_requests_total",
		"Requests decided under --candidate-config, by outcome: agree, would_reject (granted live), would_grant (rejected live).",
		[]string{"outcome"}, nil)
	errorsDesc = prometheus.NewDesc("charon_candidate_errors_total",
		"Requests the candidate configuration could not decide (they were answered as live).", nil, nil)
)

// Describe implements prometheus.Collector.
func (c *Canary) Describe(ch chan<- *prometheus.Desc) {
	ch <- decisionsDesc
	ch <- requestsDesc
	ch <- errorsDesc
}

// Collect implements prometheus.Collector.
func (c *Canary) Collect(ch chan<- prometheus.Metric) {
	for i, o := range outcomes {
		ch <- prometheus.MustNewConstMetric(requestsDesc, prometheus.CounterValue, float64(c.requests[i].Load()), o)
	}
	ch <- prometheus.MustNewConstMetric(errorsDesc, prometheus.CounterValue, float64(c.errors.Load()))
	t := c.rules.Load()
	if t == nil {
		return
	}
	for _, rc := range t.list {
		for i, o := range outcomes {
			ch <- prometheus.MustNewConstMetric(decisionsDesc, prometheus.CounterValue, float64(rc.n[i].Load()), rc.domain, rc.rule, o)
		}
	}
}
