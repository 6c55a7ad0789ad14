// Package sim is the tier simulator: a page that runs package tiers,
// compiled to WebAssembly, on requests a person sends with the spacebar,
// and draws every tier's timeline. Lane is the part the WebAssembly module
// exports (tested here as plain Go); Handler serves the page.
package sim

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/tiers"
)

// errNotBuilt is WriteFiles' error in a binary built without the engine.
var errNotBuilt = errors.New("sim: the engine was not built into this binary: run make sim-wasm (go generate ./internal/sim) before building")

// fileName is the name the simulator gives a pasted configuration, as it
// appears in error messages.
const fileName = "sim.yaml"

// Lane is one configuration and its pair's state. Not safe for concurrent
// use (the page is single-threaded).
type Lane struct {
	yaml   string
	policy *tiers.Policy
	leaf   string
	state  tiers.State
	global tiers.Global
}

// Load parses text, a configuration file in envoyproxy/ratelimit's format
// with Charon's extensions (or a single descriptor, which is put in a domain
// "sim"), exactly as `charon config check` does, and returns a fresh lane
// limited by its first rate-limited leaf. The error holds config check's
// messages.
func Load(text string) (*Lane, error) {
	var top map[string]any
	if err := yaml.Unmarshal([]byte(text), &top); err != nil {
		return nil, fmt.Errorf("%s: %v", fileName, err)
	}
	wrapped := false
	if _, ok := top["descriptors"]; !ok && top["key"] != nil {
		wrapped = true
		// One descriptor: indent it under a domain.
		var b strings.Builder
		b.WriteString("domain: sim\ndescriptors:\n")
		for i, line := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
			if i == 0 {
				b.WriteString("  - " + line + "\n")
			} else {
				b.WriteString("    " + line + "\n")
			}
		}
		text = b.String()
	}
	cfg, _, err := config.Load(config.Files{fileName: []byte(text)}, config.Options{})
	if err != nil {
		var msgs []string
		for _, p := range config.Problems(err) {
			var ce *config.Error
			if wrapped && errors.As(p, &ce) {
				// Name the lines and fields of the text as pasted.
				c := *ce
				c.Line = max(0, c.Line-2)
				c.Path = strings.TrimPrefix(c.Path, "descriptors[0].")
				p = &c
			}
			msgs = append(msgs, p.Error())
		}
		return nil, errors.New(strings.Join(msgs, "\n"))
	}
	for _, d := range cfg.Tree.Domains() {
		for _, lf := range cfg.Tree.Leaves(d.Name) {
			if lf.Limit != nil && lf.Limit.Policy != nil {
				return &Lane{yaml: text, policy: lf.Limit.Policy, leaf: leafName(lf)}, nil
			}
		}
	}
	return nil, fmt.Errorf("%s: no descriptor with a rate limit (tiers, rate_limit, token_bucket)", fileName)
}

func leafName(lf descriptors.Leaf) string {
	var parts []string
	for _, e := range lf.Path {
		if e.Value == "" {
			parts = append(parts, e.Key)
		} else {
			parts = append(parts, e.Key+"="+e.Value)
		}
	}
	return fmt.Sprintf("%s:%d %s", lf.Limit.File, lf.Limit.Line, strings.Join(parts, "."))
}

// YAML returns the configuration the lane was loaded from, as a file.
func (l *Lane) YAML() string { return l.yaml }

// Decision is the answer to one request, for the page.
type Decision struct {
	At        float64 `json:"at"` // ms
	Hits      int64   `json:"hits"`
	OK        bool    `json:"ok"`
	Granted   int64   `json:"granted"`
	Tier      int     `json:"tier"`
	Burst     bool    `json:"burst"`
	Remaining int64   `json:"remaining"`
	// RetryAfter and ResetAfter in ms; RetryNever when no wait helps.
	RetryAfter float64 `json:"retryAfter"`
	RetryNever bool    `json:"retryNever"`
	ResetAfter float64 `json:"resetAfter"`
	LimitedBy  string  `json:"limitedBy,omitempty"`
}

// Request decides a request of hits at now (ms since the Unix epoch), all
// or nothing, and commits a grant.
func (l *Lane) Request(now float64, hits int64) Decision {
	d := tiers.Request(l.policy, &l.state, &l.global, at(now), hits, hits)
	out := Decision{At: now, Hits: hits, OK: d.OK, Granted: d.Granted, Tier: d.Tier, Burst: d.Burst, Remaining: d.Remaining,
		ResetAfter: ms(d.ResetAfter)}
	switch {
	case d.OK:
	case d.RetryAfter == tiers.Unbounded:
		out.RetryNever = true
	default:
		out.RetryAfter = ms(d.RetryAfter)
	}
	if !d.OK {
		out.LimitedBy = d.Limiter()
	}
	return out
}

// Tier is one tier's configuration and state, for the page.
type Tier struct {
	Limit    int64   `json:"limit"`
	Window   float64 `json:"window"` // ms
	Active   float64 `json:"active"` // ms; -1: unbounded
	Cooldown float64 `json:"cooldown"`
	Skip     bool    `json:"skippable"`
	Phase    string  `json:"phase"`
	Hits     int64   `json:"hits"`
	// EnteredAt, ActiveUntil and CooldownUntil in ms (0: never, or never
	// ends).
	EnteredAt     float64 `json:"enteredAt"`
	ActiveUntil   float64 `json:"activeUntil"`
	CooldownUntil float64 `json:"cooldownUntil"`
}

// State is the lane's view at an instant, for the page.
type State struct {
	Now          float64 `json:"now"`
	Leaf         string  `json:"leaf"`
	Kind         string  `json:"kind"`
	Tier         int     `json:"tier"`
	Tiers        []Tier  `json:"tiers"`
	HardLimit    int64   `json:"hardLimit"`
	GlobalLimit  int64   `json:"globalLimit"`
	DomainHits   int64   `json:"domainHits"`
	ResourceHits int64   `json:"resourceHits"`
	// Used and Capacity: a token bucket's credits in use and capacity, a
	// fixed window's count and limit.
	Used       int64   `json:"used"`
	Capacity   int64   `json:"capacity"`
	Remaining  int64   `json:"remaining"`
	RetryAfter float64 `json:"retryAfter"`
	RetryNever bool    `json:"retryNever"`
	ResetAfter float64 `json:"resetAfter"`
	// Next is the next change with no traffic (ms; 0: none).
	Next    float64 `json:"next"`
	Summary string  `json:"summary"`
}

// State returns the lane's view at now (ms), changing nothing.
func (l *Lane) State(now float64) State {
	v := tiers.Inspect(l.policy, &l.state, &l.global, at(now))
	p := l.policy
	out := State{Now: now, Leaf: l.leaf, Tier: v.Tier, HardLimit: p.HardLimit, GlobalLimit: p.GlobalLimit,
		DomainHits: v.DomainHits, ResourceHits: v.ResourceHits, Used: v.Used, Capacity: v.Capacity,
		Remaining: v.Remaining, ResetAfter: ms(v.ResetAfter), Next: stamp(v.Next), Summary: v.Summary(p), Tiers: []Tier{}}
	out.Kind = p.Kind.String()
	if v.RetryAfter == tiers.Unbounded {
		out.RetryNever = true
	} else {
		out.RetryAfter = ms(v.RetryAfter)
	}
	for i, tv := range v.Tiers {
		tr := p.Tiers[i]
		t := Tier{Limit: tr.Limit, Window: ms(tr.Window), Active: -1, Cooldown: ms(tr.Cooldown), Skip: tr.Skippable,
			Phase: tv.Phase.String(), Hits: tv.Hits, EnteredAt: stamp(tv.EnteredAt), ActiveUntil: stamp(tv.ActiveUntil),
			CooldownUntil: stamp(tv.CooldownUntil)}
		if tr.Active != tiers.Unbounded {
			t.Active = ms(tr.Active)
		}
		out.Tiers = append(out.Tiers, t)
	}
	return out
}

func at(ms float64) time.Time { return time.UnixMicro(int64(ms * 1000)) }

func ms(d time.Duration) float64 {
	if d == tiers.Unbounded {
		return -1
	}
	return float64(d.Microseconds()) / 1000
}

func stamp(t time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return float64(t.UnixMicro()) / 1000
}

//go:generate go run ./gen
