// Package replay feeds the requests of decision logs through the engine
// under a candidate configuration, and under a baseline (another
// configuration, or the answers the log recorded), and reports per rule
// what would change: grants and rejections under each, the requests whose
// answer changes and their descriptors, and the peak usage of each limit.
//
// Each configuration is decided by its own engine over its own memory
// store, on a simulated clock that reads the logged times, so a replay is
// deterministic: the same logs and configurations give the same report.
// A complete log (charon serve --decision-log-all) holds every descriptor
// of every request; a sampled one holds every rejection and burst but only
// a share of the grants, so a replay of it sees less traffic than there
// was and underestimates what a limit would reject (Log says which it is).
package replay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/decisionlog"
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/tiers"
)

// Request is one logged request: its time, the request as the engine
// takes it, and what the log recorded of its answer.
type Request struct {
	Time time.Time
	Req  engine.Request
	// Recorded are the logged lines' rules and results, in descriptor
	// order; OverLimit the logged answer.
	Recorded  []Recorded
	OverLimit bool
}

// Recorded is what a log line says of one descriptor's decision.
type Recorded struct {
	Resource string
	Result   string
}

// Log is the requests of decision logs, in time order, and what kind of
// log they came from.
type Log struct {
	Requests []Request
	// Lines counts the lines read; Complete reports that every line came
	// from a complete log; Missing counts the requests a complete log
	// numbered but does not hold (dropped by its rate bound or queue);
	// Sampled counts lines that stand for more than one decision.
	Lines    int
	Complete bool
	Missing  int
	Sampled  int
}

// Read parses decision logs (JSON lines of decisionlog.Record). The lines
// of one request (same request name in one log) become one Request; a line
// with no request name is a request of its own. Requests are ordered by
// time, the order of the logs breaking ties.
func Read(logs ...io.Reader) (*Log, error) {
	l := &Log{Complete: true}
	type run struct{ lo, hi, n uint64 }
	runs := map[string]*run{}
	for f, r := range logs {
		byName := map[string]int{}
		err := decisionlog.ReadRecords(r, func(_ int, rp *decisionlog.Record) error {
			rec := *rp
			l.Lines++
			l.Complete = l.Complete && rec.Complete
			if rec.Weight != 0 && rec.Weight != 1 {
				l.Sampled++
			}
			d, err := descriptorOf(&rec)
			if err != nil {
				return err
			}
			i, ok := -1, false
			if rec.Request != "" {
				i, ok = byName[rec.Request]
				if prefix, num, found := strings.Cut(rec.Request, "-"); found && !ok {
					var k uint64
					if _, err := fmt.Sscan(num, &k); err == nil {
						ru := runs[prefix]
						if ru == nil {
							ru = &run{lo: k, hi: k}
							runs[prefix] = ru
						}
						ru.lo, ru.hi, ru.n = min(ru.lo, k), max(ru.hi, k), ru.n+1
					}
				}
			}
			if !ok {
				i = len(l.Requests)
				l.Requests = append(l.Requests, Request{Time: rec.Time, Req: engine.Request{Domain: rec.RLSDomain}})
				if rec.Request != "" {
					byName[rec.Request] = i
				}
			}
			q := &l.Requests[i]
			q.Req.Descriptors = append(q.Req.Descriptors, d)
			q.Recorded = append(q.Recorded, Recorded{Resource: rec.Resource, Result: rec.Result})
			q.OverLimit = q.OverLimit || rec.OverLimit || rec.Result == decisionlog.ResultRejected && rec.Request == ""
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("log %d, %w", f+1, err)
		}
	}
	if l.Lines == 0 {
		l.Complete = false
	}
	if l.Complete {
		for _, ru := range runs {
			l.Missing += int(ru.hi - ru.lo + 1 - ru.n)
		}
	}
	slices.SortStableFunc(l.Requests, func(a, b Request) int { return a.Time.Compare(b.Time) })
	return l, nil
}

func descriptorOf(rec *decisionlog.Record) (engine.Descriptor, error) {
	d := engine.Descriptor{Hits: uint64(rec.Hits), HasHits: true, Refund: rec.Refund}
	d.Entries = make([]descriptors.Entry, len(rec.Entries))
	for i, e := range rec.Entries {
		d.Entries[i] = descriptors.Entry{Key: e.Key, Value: e.Value}
	}
	if o := rec.Override; o != nil {
		u, ok := tiers.ParseUnit(o.Unit)
		if !ok {
			return d, fmt.Errorf("override unit %q", o.Unit)
		}
		d.Override = &engine.Override{RequestsPerUnit: o.RequestsPerUnit, Unit: u, Multiplier: o.Multiplier}
	}
	return d, nil
}

// Options configure Run.
type Options struct {
	// Candidate is the configuration to try; required.
	Candidate *config.Config
	// Against is the baseline configuration, replayed like Candidate; nil
	// takes the answers the log recorded as the baseline (then the
	// baseline's peaks are unknown).
	Against *config.Config
	// Engine holds the engine settings both sides decide with (QuotaMode,
	// FixedWindowOverrides, Overdraft); its Store and Now are Run's.
	Engine engine.Options
	// Top bounds the descriptors listed per rule and way; 0 lists all.
	Top int
}

// Report is what a replay found.
type Report struct {
	// Baseline is "recorded" or "against"; Log summarizes the log.
	Baseline string  `json:"baseline"`
	Log      LogInfo `json:"log"`
	// Requests counts the requests replayed; Invalid those the engine
	// refused (bad input); NewlyRejected and NewlyGranted the requests
	// whose answer changes from the baseline to the candidate.
	Requests      int    `json:"requests"`
	Invalid       int    `json:"invalid"`
	NewlyRejected int64  `json:"newly_rejected"`
	NewlyGranted  int64  `json:"newly_granted"`
	Rules         []Rule `json:"rules"`
}

// LogInfo is Log's summary.
type LogInfo struct {
	Lines    int  `json:"lines"`
	Complete bool `json:"complete"`
	Missing  int  `json:"missing"`
	Sampled  int  `json:"sampled"`
}

// Rule is one rule's figures: a rule of either configuration (or, for a
// recorded baseline, of the log), by RLS domain and resource.
type Rule struct {
	Domain     string `json:"domain"`
	Descriptor string `json:"descriptor"`
	Resource   string `json:"resource"`
	Baseline   Side   `json:"baseline"`
	Candidate  Side   `json:"candidate"`
	// NewlyRejected counts the requests the candidate rejects through
	// this rule that the baseline granted; NewlyGranted those the
	// baseline rejected through it that the candidate grants. Top... list
	// their descriptors, most frequent first.
	NewlyRejected    int64   `json:"newly_rejected"`
	NewlyGranted     int64   `json:"newly_granted"`
	TopNewlyRejected []Count `json:"top_newly_rejected"`
	TopNewlyGranted  []Count `json:"top_newly_granted"`
}

// Side is a rule's figures under one configuration.
type Side struct {
	// Limit describes the rule's limit ("" when the side has no such
	// rule; "recorded" for a recorded baseline).
	Limit string `json:"limit"`
	// Matched counts the descriptors the rule decided; Granted, Rejected
	// and Shadow split them (Shadow: rejected by the limit, answered OK
	// by shadow mode or ignore_limits). A descriptor granted in a request
	// another descriptor rejected counts as granted.
	Matched  int64 `json:"matched"`
	Granted  int64 `json:"granted"`
	Rejected int64 `json:"rejected"`
	Shadow   int64 `json:"shadow"`
	// Peak is the largest share of the current tier's limit in use after
	// a decision (hits in its window over its limit; for a token bucket,
	// credits in use over its capacity); -1 when unknown.
	Peak float64 `json:"peak"`
	// TopRejected lists the rejected descriptors, most frequent first.
	TopRejected []Count `json:"top_rejected"`
}

// Count is a descriptor ("k=v,k2=v2") and how many times it counts.
type Count struct {
	Descriptor string `json:"descriptor"`
	Count      int64  `json:"count"`
}

type ruleKey struct{ domain, resource string }

// acc accumulates one rule's figures.
type acc struct {
	rule                        Rule
	rejected                    [2]map[string]int64
	newlyRejected, newlyGranted map[string]int64
}

// side is one configuration being replayed.
type side struct {
	eng  *engine.Engine
	now  time.Time
	resp engine.Response
}

func newSide(cfg *config.Config, opts engine.Options) *side {
	s := &side{}
	opts.Store = memstore.New(memstore.Options{Shards: 1, MaxKeys: -1})
	// The log's clock, and no wall-clock wait for a paced request.
	opts.Now, opts.Sleep = func() time.Time { return s.now }, engine.NoWait
	s.eng = engine.New(opts)
	s.eng.SetTree(cfg.Tree)
	return s
}

// outcome is one descriptor's answer under one side.
type outcome struct {
	resource string
	over     bool // OVER_LIMIT
	shadow   bool
	limited  bool
	peak     float64
}

// Run replays log under opts.
func Run(ctx context.Context, log *Log, opts Options) (*Report, error) {
	if opts.Candidate == nil {
		return nil, errors.New("replay: no candidate configuration")
	}
	rep := &Report{Baseline: "recorded", Log: LogInfo{Lines: log.Lines, Complete: log.Complete, Missing: log.Missing, Sampled: log.Sampled}}
	cand := newSide(opts.Candidate, opts.Engine)
	var base *side
	if opts.Against != nil {
		rep.Baseline = "against"
		base = newSide(opts.Against, opts.Engine)
	}
	rules := map[ruleKey]*acc{}
	get := func(domain, resource string) *acc {
		k := ruleKey{domain, resource}
		a := rules[k]
		if a == nil {
			a = &acc{rule: Rule{Domain: domain, Resource: resource, Baseline: Side{Peak: -1}, Candidate: Side{Peak: -1}},
				newlyRejected: map[string]int64{}, newlyGranted: map[string]int64{}}
			a.rejected[0], a.rejected[1] = map[string]int64{}, map[string]int64{}
			rules[k] = a
		}
		return a
	}
	var outs [2][]outcome
	for i := range log.Requests {
		q := &log.Requests[i]
		var over [2]bool
		ok := true
		for s, sd := range []*side{base, cand} {
			if sd == nil {
				outs[s], over[s] = recorded(q, outs[s][:0]), q.OverLimit
				continue
			}
			var err error
			outs[s], over[s], err = sd.decide(ctx, q, outs[s][:0])
			if err != nil {
				var ie *descriptors.InputError
				if errors.As(err, &ie) {
					ok = false
					break
				}
				return nil, err
			}
		}
		if !ok {
			rep.Invalid++
			continue
		}
		rep.Requests++
		for j := range q.Req.Descriptors {
			desc := ""
			for s := range 2 {
				o := &outs[s][j]
				if !o.limited {
					continue
				}
				a := get(q.Req.Domain, o.resource)
				sd := &a.rule.Baseline
				if s == 1 {
					sd = &a.rule.Candidate
				}
				sd.Matched++
				switch {
				case o.over:
					sd.Rejected++
					if desc == "" {
						desc = descriptorString(q.Req.Descriptors[j].Entries)
					}
					a.rejected[s][desc]++
				case o.shadow:
					sd.Shadow++
				default:
					sd.Granted++
				}
				sd.Peak = max(sd.Peak, o.peak)
			}
		}
		switch {
		case !over[0] && over[1]:
			rep.NewlyRejected++
			attribute(q, outs[1], get, func(a *acc, d string) { a.rule.NewlyRejected++; a.newlyRejected[d]++ })
		case over[0] && !over[1]:
			rep.NewlyGranted++
			attribute(q, outs[0], get, func(a *acc, d string) { a.rule.NewlyGranted++; a.newlyGranted[d]++ })
		}
	}
	for k, a := range rules {
		r := &a.rule
		r.Descriptor = r.Resource
		if path, ok := descriptors.ParseResource(k.domain, k.resource); ok {
			r.Descriptor = config.PathString(path)
		}
		for s, cfg := range []*config.Config{opts.Against, opts.Candidate} {
			sd := &r.Baseline
			if s == 1 {
				sd = &r.Candidate
			}
			if cfg == nil {
				sd.Limit = "recorded"
			} else if lf := leaf(cfg, k.domain, k.resource); lf != nil {
				sd.Limit, r.Descriptor = config.DescribeLimit(lf.Limit), config.PathString(lf.Path)
			}
			sd.TopRejected = top(a.rejected[s], opts.Top)
		}
		r.TopNewlyRejected, r.TopNewlyGranted = top(a.newlyRejected, opts.Top), top(a.newlyGranted, opts.Top)
		rep.Rules = append(rep.Rules, *r)
	}
	slices.SortFunc(rep.Rules, func(a, b Rule) int {
		return cmp.Or(strings.Compare(a.Domain, b.Domain), strings.Compare(a.Resource, b.Resource))
	})
	if rep.Rules == nil {
		rep.Rules = []Rule{}
	}
	return rep, nil
}

// attribute calls f for each rule of a request's descriptors that answered
// OVER_LIMIT in outs (the side that rejects it).
func attribute(q *Request, outs []outcome, get func(string, string) *acc, f func(*acc, string)) {
	for j := range outs {
		if o := &outs[j]; o.limited && o.over {
			f(get(q.Req.Domain, o.resource), descriptorString(q.Req.Descriptors[j].Entries))
		}
	}
}

// recorded reads a request's recorded outcomes.
func recorded(q *Request, out []outcome) []outcome {
	for _, r := range q.Recorded {
		o := outcome{resource: r.Resource, peak: -1}
		switch r.Result {
		case decisionlog.ResultRejected:
			o.limited, o.over = true, true
		case decisionlog.ResultShadow:
			o.limited, o.shadow = true, true
		case decisionlog.ResultGranted:
			o.limited = r.Resource != ""
		}
		out = append(out, o)
	}
	return out
}

// decide decides q under the side at q's time.
func (sd *side) decide(ctx context.Context, q *Request, out []outcome) ([]outcome, bool, error) {
	sd.now = q.Time
	if err := sd.eng.Decide(ctx, &q.Req, &sd.resp); err != nil {
		return out, false, err
	}
	for j := range sd.resp.Statuses {
		st := &sd.resp.Statuses[j]
		o := outcome{resource: st.Match.Resource, limited: st.Limit != nil, over: st.Code == engine.CodeOverLimit, shadow: st.Shadow, peak: -1}
		if d := &st.Decision; o.limited && d.TierLimit > 0 {
			o.peak = float64(d.TierHits) / float64(d.TierLimit)
		}
		out = append(out, o)
	}
	return out, sd.resp.Code == engine.CodeOverLimit, nil
}

func leaf(cfg *config.Config, domain, resource string) *descriptors.Leaf {
	ls := cfg.Tree.Leaves(domain)
	i, ok := slices.BinarySearchFunc(ls, resource, func(l descriptors.Leaf, r string) int { return strings.Compare(l.Resource, r) })
	if !ok {
		return nil
	}
	return &ls[i]
}

// descriptorString writes a request descriptor as "k=v,k2=v2".
func descriptorString(es []descriptors.Entry) string {
	var b strings.Builder
	for i, e := range es {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(e.Key)
		b.WriteByte('=')
		b.WriteString(e.Value)
	}
	return b.String()
}

// top lists m's entries by count, most first (then by descriptor), at
// most n of them (0: all).
func top(m map[string]int64, n int) []Count {
	out := make([]Count, 0, len(m))
	for d, c := range m {
		out = append(out, Count{d, c})
	}
	slices.SortFunc(out, func(a, b Count) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), strings.Compare(a.Descriptor, b.Descriptor))
	})
	if n > 0 && len(out) > n {
		out = out[:n]
	}
	return out
}
