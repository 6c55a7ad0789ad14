// Package suggest proposes rate limits from a decision log: for each RLS
// domain and descriptor key path it finds the smallest one-tier limit that
// would have rejected at most a given share of the recorded hits, by
// replaying the log through package tiers.
package suggest

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/charonlimit/charon/internal/decisionlog"
	"github.com/charonlimit/charon/tiers"
)

// Options configure Suggest.
type Options struct {
	// Reject is the share of a group's recorded hits the proposed limit may
	// reject, in [0, 1).
	Reject float64
	// Window is the proposed tier's window; 0 means one second.
	Window time.Duration
}

// Proposal is the limit proposed for one group: the descriptors of one RLS
// domain with one key path, each distinct set of values a Charon domain.
type Proposal struct {
	RLSDomain string
	Keys      []string
	Limit     int64
	Window    time.Duration
	// Hits, Domains and Rejected describe the replay: recorded hits (by
	// their weights), distinct Charon domains, hits the limit would have
	// rejected.
	Hits, Rejected int64
	Domains        int
	// P50, P99 and Max are percentiles of the hits of a Charon domain in a
	// window (aligned windows with at least one hit).
	P50, P99, Max int64
}

type event struct {
	at     int64 // µs
	domain string
	hits   int64
}

type group struct {
	rls    string
	keys   []string
	events []event
}

// Read parses a decision log (JSON lines) into groups. Lines that are not
// records are an error naming the line.
func read(r io.Reader) (map[string]*group, error) {
	groups := make(map[string]*group)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Bytes()
		if len(strings.TrimSpace(string(line))) == 0 {
			continue
		}
		var rec decisionlog.Record
		if err := json.Unmarshal(line, &rec); err != nil {
			return nil, fmt.Errorf("line %d: %v", n, err)
		}
		if rec.RLSDomain == "" || len(rec.Entries) == 0 || rec.Hits < 0 || rec.Weight < 0 {
			return nil, fmt.Errorf("line %d: not a decision (rls_domain, entries, hits and weight are required)", n)
		}
		keys := make([]string, len(rec.Entries))
		vals := make([]string, len(rec.Entries))
		for i, e := range rec.Entries {
			keys[i], vals[i] = e.Key, e.Value
		}
		id := rec.RLSDomain + "\x00" + strings.Join(keys, "\x00")
		g := groups[id]
		if g == nil {
			g = &group{rls: rec.RLSDomain, keys: keys}
			groups[id] = g
		}
		w := rec.Weight
		if w == 0 {
			w = 1
		}
		h := math.Round(float64(max(rec.Hits, 1)) * w)
		if h > 1<<50 {
			return nil, fmt.Errorf("line %d: hits times weight is above 2^50", n)
		}
		hits := int64(h)
		g.events = append(g.events, event{at: rec.Time.UnixMicro(), domain: strings.Join(vals, "|"), hits: hits})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return groups, nil
}

// Suggest reads a decision log from r and proposes a limit per group,
// sorted by RLS domain and keys.
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
		slices.SortStableFunc(g.events, func(a, b event) int { return cmpInt(a.at, b.at) })
		out = append(out, propose(g, opts))
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].RLSDomain != out[j].RLSDomain {
			return out[i].RLSDomain < out[j].RLSDomain
		}
		return strings.Join(out[i].Keys, "\x00") < strings.Join(out[j].Keys, "\x00")
	})
	return out, nil
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// propose finds, by bisection, the smallest limit whose replay rejects at
// most opts.Reject of the group's hits (the answer always meets the bound:
// a limit of every recorded hit rejects none).
func propose(g *group, opts Options) Proposal {
	p := Proposal{RLSDomain: g.rls, Keys: g.keys, Window: opts.Window}
	w := tiers.Micros(opts.Window)
	perWindow := make(map[struct {
		d string
		n int64
	}]int64)
	domains := make(map[string]bool)
	for _, e := range g.events {
		p.Hits += e.hits
		domains[e.domain] = true
		perWindow[struct {
			d string
			n int64
		}{e.domain, floorDiv(e.at, w)}] += e.hits
	}
	p.Domains = len(domains)
	counts := make([]int64, 0, len(perWindow))
	for _, c := range perWindow {
		counts = append(counts, c)
	}
	slices.Sort(counts)
	p.P50, p.P99, p.Max = pct(counts, 0.5), pct(counts, 0.99), counts[len(counts)-1]
	allowed := int64(opts.Reject * float64(p.Hits))
	lo, hi := int64(1), max(p.Max, 1)
	for lo < hi {
		mid := lo + (hi-lo)/2
		if replay(g, mid, opts.Window) <= allowed {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	if rej := replay(g, hi, opts.Window); rej > allowed {
		// The aligned maximum did not suffice for a sliding window: grow.
		for hi < p.Hits && rej > allowed {
			hi *= 2
			rej = replay(g, hi, opts.Window)
		}
	}
	p.Limit, p.Rejected = hi, replay(g, hi, opts.Window)
	return p
}

// replay returns the hits a one-tier limit would have rejected.
func replay(g *group, limit int64, window time.Duration) int64 {
	pol := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: limit, Window: window, Active: tiers.Unbounded}}}
	states := make(map[string]*tiers.State)
	var rejected int64
	for _, e := range g.events {
		s := states[e.domain]
		if s == nil {
			s = new(tiers.State)
			states[e.domain] = s
		}
		if d := tiers.Request(pol, s, nil, time.UnixMicro(e.at), e.hits, e.hits); !d.OK {
			rejected += e.hits
		}
	}
	return rejected
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
