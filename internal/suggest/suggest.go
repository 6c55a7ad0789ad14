// Package suggest proposes rate limits from a decision log: for each rule
// the log's decisions matched (its RLS domain and resource: keys, fixed
// values and wildcards as configured), and for the traffic that matched no
// rule, it finds the smallest limit that would have rejected at most a
// given share of the recorded hits, by replaying the log through package
// tiers. Given the configuration in force, it keeps every rule as it is
// written and changes only the limits it proposes (Edit); without one, it
// writes new files (Files).
package suggest

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/decisionlog"
	"github.com/charonlimit/charon/tiers"
)

// Options configure Suggest.
type Options struct {
	// Reject is the share of a group's recorded hits the proposed limit may
	// reject, in [0, 1).
	Reject float64
	// Window is the window of a limit proposed where there is no rule to
	// take it from (no Config, or traffic that matched no rule); 0 means
	// one second.
	Window time.Duration
	// Config, when set, is the configuration the log was recorded under:
	// each rule's limit is proposed over its own window and algorithm, and
	// Edit keeps everything else of it.
	Config *config.Config
}

// Proposal is the limit proposed for one group of the log's decisions: the
// descriptors one rule matched, or those of one key path that matched none.
type Proposal struct {
	RLSDomain string
	// Path is the rule's path (Value "" for a key alone, a pattern with "*"
	// for a wildcard); Resource its resource ("" for traffic that matched no
	// rule, whose Path has keys only).
	Path     []descriptors.Entry
	Resource string
	// Shadow reports a rule in shadow mode (from Config, or from the log's
	// shadow rejections).
	Shadow bool
	// Leaf is the rule in Config (nil without one, or when the log's rule
	// is not in it).
	Leaf *descriptors.Leaf
	// Policy is the proposed policy (the rule's own with the new limit); nil
	// when none is proposed, Note then saying why.
	Policy *tiers.Policy
	Limit  int64
	Window time.Duration
	Note   string
	// Hits, Domains and Rejected describe the replay: recorded hits (by
	// their weights), distinct Charon domains, hits the limit would have
	// rejected.
	Hits, Rejected int64
	Domains        int
	// P50, P99 and Max are percentiles of the hits of a Charon domain in a
	// window (aligned windows with at least one hit).
	P50, P99, Max int64
}

// Descriptor is the proposal's path written as a descriptor ("k=v,k2").
func (p *Proposal) Descriptor() string { return config.PathString(p.Path) }

type event struct {
	at     int64 // µs
	domain string
	hits   int64
}

type group struct {
	rls      string
	resource string
	path     []descriptors.Entry
	shadow   bool
	events   []event
}

// read parses a decision log (JSON lines) into groups. Lines that are not
// records are an error naming the line.
func read(r io.Reader) (map[string]*group, error) {
	groups := make(map[string]*group)
	err := decisionlog.ReadRecords(r, func(_ int, rp *decisionlog.Record) error {
		rec := *rp
		if rec.Result == decisionlog.ResultNotLimited {
			return nil
		}
		keys := make([]string, len(rec.Entries))
		vals := make([]string, len(rec.Entries))
		for i, e := range rec.Entries {
			keys[i], vals[i] = e.Key, e.Value
		}
		var id, domain string
		if rec.Resource != "" {
			id, domain = "r\x00"+rec.RLSDomain+"\x00"+rec.Resource, rec.Domain
		} else {
			id, domain = "k\x00"+rec.RLSDomain+"\x00"+strings.Join(keys, "\x00"), strings.Join(vals, "|")
		}
		g := groups[id]
		if g == nil {
			g = &group{rls: rec.RLSDomain, resource: rec.Resource}
			if rec.Resource != "" {
				g.path = pathOf(rec.RLSDomain, rec.Resource, keys)
			} else {
				for _, k := range keys {
					g.path = append(g.path, descriptors.Entry{Key: k})
				}
			}
			groups[id] = g
		}
		g.shadow = g.shadow || rec.Result == decisionlog.ResultShadow
		w := rec.Weight
		if w == 0 {
			w = 1
		}
		h := math.Round(float64(max(rec.Hits, 1)) * w)
		if h > 1<<50 {
			return fmt.Errorf("hits times weight is above 2^50")
		}
		g.events = append(g.events, event{at: rec.Time.UnixMicro(), domain: domain, hits: int64(h)})
		return nil
	})
	if err != nil {
		return nil, err
	}
	return groups, nil
}

// pathOf reads a rule's path back from its resource; a resource that
// cannot be read back (cut to its bound) gives the request's keys alone.
func pathOf(rls, resource string, keys []string) []descriptors.Entry {
	if path, ok := descriptors.ParseResource(rls, resource); ok {
		return path
	}
	path := make([]descriptors.Entry, len(keys))
	for i, k := range keys {
		path[i].Key = k
	}
	return path
}

// Suggest reads a decision log from r and proposes a limit per group,
// sorted by RLS domain, then resource (rules before unmatched traffic).
func Suggest(r io.Reader, opts Options) ([]Proposal, error) {
	if opts.Reject < 0 || opts.Reject >= 1 {
		return nil, errors.New("suggest: the share to reject must be in [0, 1)")
	}
	if opts.Window == 0 {
		opts.Window = time.Second
	}
	if opts.Window < time.Millisecond || opts.Window > tiers.MaxDuration {
		return nil, fmt.Errorf("suggest: window %s is out of range", opts.Window)
	}
	groups, err := read(r)
	if err != nil {
		return nil, err
	}
	var out []Proposal
	for _, g := range groups {
		slices.SortStableFunc(g.events, func(a, b event) int { return cmp.Compare(a.at, b.at) })
		out = append(out, propose(g, opts))
	}
	slices.SortFunc(out, func(a, b Proposal) int {
		return cmp.Or(strings.Compare(a.RLSDomain, b.RLSDomain), cmp.Compare(b2i(a.Resource == ""), b2i(b.Resource == "")),
			strings.Compare(a.Resource, b.Resource), strings.Compare(a.Descriptor(), b.Descriptor()))
	})
	return out, nil
}

// shape returns the policy whose limit is searched for g, with a function
// giving it for a limit; nil with a note when the rule's policy has no one
// limit to propose.
func shape(g *group, opts Options, p *Proposal) func(int64) *tiers.Policy {
	oneTier := func(w time.Duration) func(int64) *tiers.Policy {
		return func(n int64) *tiers.Policy { return oneTierPolicy(n, w) }
	}
	if opts.Config == nil || g.resource == "" {
		p.Window = opts.Window
		return oneTier(opts.Window)
	}
	for _, lf := range opts.Config.Tree.Leaves(g.rls) {
		if lf.Resource == g.resource {
			p.Leaf = &lf
			break
		}
	}
	if p.Leaf == nil {
		p.Note = "the rule is not in the configuration"
		p.Window = opts.Window
		return oneTier(opts.Window)
	}
	p.Path, p.Shadow = p.Leaf.Path, p.Leaf.Limit.ShadowMode
	base := p.Leaf.Limit.Policy
	switch {
	case base == nil:
		p.Note = "not rate limited (unlimited or copies): kept"
	case base.Kind == tiers.KindFixedWindow:
		p.Window = base.Window.Unit.Length()
		return func(n int64) *tiers.Policy {
			c := *base
			c.Window.Limit = n
			return &c
		}
	case base.Kind == tiers.KindTiers && len(base.Tiers) == 1:
		p.Window = base.Tiers[0].Window
		return func(n int64) *tiers.Policy {
			c := *base
			c.Tiers = []tiers.Tier{base.Tiers[0]}
			c.Tiers[0].Limit = n
			return &c
		}
	default:
		p.Note = "not one limit (tiers, token bucket or a closed rule): kept as configured"
	}
	return nil
}

// propose finds the smallest limit whose replay rejects at most opts.Reject
// of the group's hits: from the aligned maximum it doubles until the
// target is met (a limit of every recorded hit rejects none), then bisects
// between the last limit that missed and the first that met it.
func propose(g *group, opts Options) Proposal {
	p := Proposal{RLSDomain: g.rls, Resource: g.resource, Path: g.path, Shadow: g.shadow}
	policy := shape(g, opts, &p)
	events := g.events
	if p.Leaf != nil && len(p.Leaf.Limit.Overrides) > 0 {
		// A Charon domain with an override has its own limit: kept.
		events = slices.DeleteFunc(slices.Clone(events), func(e event) bool { return p.Leaf.Limit.Overrides[e.domain] != nil })
	}
	w := tiers.Micros(max(p.Window, time.Microsecond))
	type win struct {
		d string
		n int64
	}
	perWindow := make(map[win]int64)
	domains := make(map[string]bool)
	for _, e := range events {
		p.Hits += e.hits
		domains[e.domain] = true
		perWindow[win{e.domain, floorDiv(e.at, w)}] += e.hits
	}
	p.Domains = len(domains)
	if len(perWindow) == 0 || policy == nil {
		return p
	}
	counts := make([]int64, 0, len(perWindow))
	for _, c := range perWindow {
		counts = append(counts, c)
	}
	slices.Sort(counts)
	p.P50, p.P99, p.Max = pct(counts, 0.5), pct(counts, 0.99), counts[len(counts)-1]
	allowed := int64(opts.Reject * float64(p.Hits))
	rejected := func(n int64) int64 { return replay(events, policy(n)) }
	lo, hi := int64(1), max(p.Max, 1)
	top := max(p.Hits, 1)
	for rejected(hi) > allowed && hi < top {
		lo, hi = hi+1, min(hi*2, top)
	}
	for lo < hi {
		mid := lo + (hi-lo)/2
		if rejected(mid) <= allowed {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	p.Limit, p.Policy, p.Rejected = hi, policy(hi), rejected(hi)
	if p.Rejected > allowed {
		p.Note = "no limit meets the target: the rule's hard or global limit rejects more"
	}
	return p
}

// replay returns the hits policy pol would have rejected of events, each
// Charon domain with its own state.
func replay(events []event, pol *tiers.Policy) int64 {
	states := make(map[string]*tiers.State)
	var global *tiers.Global
	if pol.GlobalLimit > 0 {
		global = new(tiers.Global)
	}
	var rejected int64
	for _, e := range events {
		s := states[e.domain]
		if s == nil {
			s = new(tiers.State)
			states[e.domain] = s
		}
		if d := tiers.Request(pol, s, global, time.UnixMicro(e.at), e.hits, e.hits); !d.OK {
			rejected += e.hits
		}
	}
	return rejected
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func pct(sorted []int64, q float64) int64 {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

func oneTierPolicy(n int64, w time.Duration) *tiers.Policy {
	return &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: n, Window: w, Active: tiers.Unbounded}}}
}
