package offenders

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/charonlimit/charon/descriptors"
)

// Defaults of Options' zero fields.
const (
	DefaultK        = 32
	DefaultMaxRules = 256
	DefaultEpoch    = time.Minute
)

// Step and Steps are the chart's resolution: decision counts per Step over
// the last Steps steps (five minutes).
const (
	Step  = 5 * time.Second
	Steps = 60
)

// Outcome is what a descriptor's hits got.
type Outcome uint8

// Outcomes. Shadow hits (over the limit, answered OK by shadow mode or
// ignore_limits) go to the rejected sketch: they are who the limit would
// stop; the chart counts them apart.
const (
	Granted Outcome = iota
	Rejected
	Shadow
)

// Options size a Tracker.
type Options struct {
	// K is the number of values each sketch monitors (0: DefaultK).
	K int
	// MaxRules is the most rules tracked at once (0: DefaultMaxRules); a
	// rule unseen for two epochs makes room for a new one, otherwise the
	// new rule's hits are not tracked (counted in Dropped).
	MaxRules int
	// Epoch is the rotation period (0: DefaultEpoch): a read covers the
	// current epoch and the previous one, between one and two epochs.
	Epoch time.Duration
}

// Tracker tracks the top values of every rule. Safe for concurrent use; use
// NewTracker. Its memory is bounded by Options: see Bytes.
type Tracker struct {
	opts    Options
	mu      sync.RWMutex
	rules   map[ruleKey]*rule
	dropped atomic.Uint64
	// fullUntil (Unix ns) is when to look for a stale rule again after the
	// table was found full with none: until then a new rule is dropped
	// without taking the write lock (a decision must not queue on it).
	fullUntil atomic.Int64
}

// ruleKey identifies a rule: where it is written and, for rules of a
// generated file (no line: an xDS resource's), its resource.
type ruleKey struct {
	domain, file, resource string
	line                   int
}

// Rule names a rule: the RLS domain, where it is written ("file:line", or
// the configuration source's name of it), its name when it has one, and
// the resource its pairs belong to.
type Rule struct {
	Domain   string `json:"domain"`
	Rule     string `json:"rule"`
	Name     string `json:"name,omitempty"`
	Resource string `json:"resource"`
}

// RuleOf is the Rule a matched limit is attributed to.
func RuleOf(domain string, l *descriptors.Limit, resource string) Rule {
	return Rule{Domain: domain, Rule: Where(l), Name: l.Name, Resource: resource}
}

// Where is where a limit is written: descriptors.Limit.Where.
func Where(l *descriptors.Limit) string { return l.Where() }

type counts struct {
	step                      int64
	granted, rejected, shadow uint64
}

type rule struct {
	Rule
	mu         sync.Mutex
	epochStart time.Time
	// cur and prev are the current and the previous epoch's rejected (0)
	// and granted (1) sketches.
	cur, prev [2]*Sketch
	last      time.Time
	steps     [Steps]counts
}

// NewTracker returns an empty tracker.
func NewTracker(opts Options) *Tracker {
	opts.K = cmp.Or(opts.K, DefaultK)
	opts.MaxRules = cmp.Or(opts.MaxRules, DefaultMaxRules)
	opts.Epoch = cmp.Or(opts.Epoch, DefaultEpoch)
	return &Tracker{opts: opts, rules: make(map[ruleKey]*rule)}
}

// Options returns the tracker's options, defaults applied.
func (t *Tracker) Options() Options { return t.opts }

// Bytes is the most memory the sketches of a tracker of opts hold: four
// sketches of K slots per rule.
func (o Options) Bytes() int { return o.MaxRules * 4 * Bytes(o.K) }

// Dropped is the number of observations not tracked for want of room.
func (t *Tracker) Dropped() uint64 { return t.dropped.Load() }

// Observe counts hits of a descriptor whose limit l (of RLS domain domain,
// resource resource) matched, for the pair's value (its Charon domain) and
// the request's entries.
func (t *Tracker) Observe(now time.Time, domain string, l *descriptors.Limit, resource, value string, entries []descriptors.Entry, hits uint64, o Outcome) {
	k := ruleKey{domain: domain, file: l.File, line: l.Line}
	if l.Line <= 0 {
		k.resource = resource
	}
	t.mu.RLock()
	r := t.rules[k]
	t.mu.RUnlock()
	if r == nil {
		if now.UnixNano() < t.fullUntil.Load() {
			t.dropped.Add(1)
			return
		}
		if r = t.add(now, k, RuleOf(domain, l, resource)); r == nil {
			t.dropped.Add(1)
			return
		}
	}
	h := Hash(value)
	r.mu.Lock()
	r.rotate(now, t.opts.Epoch)
	r.last = now
	s := r.cur[1]
	if o != Granted {
		s = r.cur[0]
	}
	s.Add(h, value, entries, hits)
	step := now.UnixNano() / int64(Step)
	c := &r.steps[step%Steps]
	if c.step != step {
		*c = counts{step: step}
	}
	switch o {
	case Granted:
		c.granted += hits
	case Rejected:
		c.rejected += hits
	case Shadow:
		c.shadow += hits
	}
	r.mu.Unlock()
}

// add makes room for and adds a rule, or returns nil when there is none.
func (t *Tracker) add(now time.Time, k ruleKey, info Rule) *rule {
	t.mu.Lock()
	defer t.mu.Unlock()
	if r := t.rules[k]; r != nil {
		return r
	}
	if len(t.rules) >= t.opts.MaxRules {
		for ok, or := range t.rules {
			or.mu.Lock()
			stale := now.Sub(or.last) >= 2*t.opts.Epoch
			or.mu.Unlock()
			if stale {
				delete(t.rules, ok)
				break
			}
		}
		if len(t.rules) >= t.opts.MaxRules {
			// A rule turns stale after two silent epochs: look again in a
			// tenth of one.
			t.fullUntil.Store(now.Add(t.opts.Epoch / 10).UnixNano())
			return nil
		}
	}
	r := &rule{Rule: info, epochStart: now.Truncate(t.opts.Epoch)}
	for i := range 2 {
		r.cur[i], r.prev[i] = NewSketch(t.opts.K), NewSketch(t.opts.K)
	}
	t.rules[k] = r
	return r
}

// rotate moves to now's epoch: the current one becomes the previous one,
// or, after a longer silence, both are emptied.
func (r *rule) rotate(now time.Time, epoch time.Duration) {
	e := now.Truncate(epoch)
	switch {
	case !e.After(r.epochStart):
		return
	case e.Sub(r.epochStart) == epoch:
		r.prev, r.cur = r.cur, r.prev
		r.cur[0].Reset()
		r.cur[1].Reset()
	default:
		for i := range 2 {
			r.cur[i].Reset()
			r.prev[i].Reset()
		}
	}
	r.epochStart = e
}

// Window is a sketch's answer over the recent interval: the top values
// (each brackets its true count: Count-Err <= t <= Count), the total hits
// and the floor, an upper bound of the hits of any value not listed.
type Window struct {
	Items []Item `json:"items"`
	Total uint64 `json:"total"`
	Floor uint64 `json:"floor"`
}

// Part is w as a part to Merge.
func (w Window) Part() Part { return Part{Items: w.Items, Total: w.Total, Floor: w.Floor} }

// Rates are hits per Step, the oldest first, the last one the step of now
// (still filling).
type Rates struct {
	Step     time.Duration `json:"-"`
	Seconds  int           `json:"step_seconds"`
	End      time.Time     `json:"end"`
	Granted  []uint64      `json:"granted"`
	Rejected []uint64      `json:"rejected"`
	Shadow   []uint64      `json:"shadow"`
}

// View is what a Tracker knows of one rule.
type View struct {
	Rule
	// Since is the start of the interval the windows cover.
	Since    time.Time `json:"since"`
	Rejected Window    `json:"rejected"`
	Granted  Window    `json:"granted"`
	Rates    Rates     `json:"rates"`
}

// Answer is GET /top's answer (service/rls/top.go), which charon top reads and
// merges across replicas: the rules of a domain (or of every domain) with
// their top rejected and granted values over the recent interval, the rule
// with the most rejected hits first.
type Answer struct {
	At time.Time `json:"at"`
	// EpochSeconds is the epoch: the windows cover the current and the
	// previous epoch. K is each sketch's number of values; a value's error
	// is at most its window's total / K.
	EpochSeconds int    `json:"epoch_seconds"`
	K            int    `json:"k"`
	Dropped      uint64 `json:"dropped"`
	Rules        []View `json:"rules"`
}

// Views returns the rules of domain ("": every domain) named by name (its
// Rule, its configured name or its resource; "": every rule), with at most
// n values per window (n <= 0: all), the
// rule with the most rejected hits first.
func (t *Tracker) Views(now time.Time, domain, name string, n int) []View {
	t.mu.RLock()
	rs := make([]*rule, 0, len(t.rules))
	for _, r := range t.rules {
		if (domain == "" || r.Domain == domain) && (name == "" || r.Rule.Rule == name || r.Name == name || r.Resource == name) {
			rs = append(rs, r)
		}
	}
	t.mu.RUnlock()
	out := make([]View, 0, len(rs))
	for _, r := range rs {
		out = append(out, r.view(now, t.opts.Epoch, n))
	}
	slices.SortFunc(out, func(a, b View) int {
		if c := cmp.Compare(b.Rejected.Total, a.Rejected.Total); c != 0 {
			return c
		}
		return cmp.Or(cmp.Compare(a.Domain, b.Domain), cmp.Compare(a.Rule.Rule, b.Rule.Rule))
	})
	return out
}

func (r *rule) view(now time.Time, epoch time.Duration, n int) View {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rotate(now, epoch)
	v := View{Rule: r.Rule, Since: r.epochStart.Add(-epoch)}
	for i, w := range []*Window{&v.Rejected, &v.Granted} {
		cur, prev := r.cur[i], r.prev[i]
		items, total := Merge(Part{Items: cur.Items(), Total: cur.Total(), Floor: cur.Floor()},
			Part{Items: prev.Items(), Total: prev.Total(), Floor: prev.Floor()})
		floor := cur.Floor() + prev.Floor()
		if n > 0 && len(items) > n {
			// A value cut from the list may count up to the last one kept:
			// the floor bounds every value not listed.
			floor = max(floor, items[n].Count)
			items = items[:n]
		}
		*w = Window{Items: items, Total: total, Floor: floor}
	}
	step := now.UnixNano() / int64(Step)
	v.Rates = Rates{Step: Step, Seconds: int(Step / time.Second), End: time.Unix(0, (step+1)*int64(Step)).UTC(),
		Granted: make([]uint64, Steps), Rejected: make([]uint64, Steps), Shadow: make([]uint64, Steps)}
	for i := range Steps {
		s := step - Steps + 1 + int64(i)
		if s < 0 {
			continue
		}
		if c := &r.steps[s%Steps]; c.step == s {
			v.Rates.Granted[i], v.Rates.Rejected[i], v.Rates.Shadow[i] = c.granted, c.rejected, c.shadow
		}
	}
	return v
}
