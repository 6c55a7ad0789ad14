package config

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func mustLoad(t *testing.T, files ...string) *Config {
	t.Helper()
	c, _, err := load(t, Options{}, files...)
	if err != nil {
		t.Fatalf("load: %v\n%s", err, strings.Join(files, "\n"))
	}
	return c
}

const diffOld = `
domain: api
descriptors:
  - key: path
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: internal
    rate_limit: {unlimited: true}
  - key: old
    rate_limit: {unit: hour, requests_per_unit: 1}
`

const diffNew = `
domain: api
descriptors:
  - key: path
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: path
    value: /login
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 50}
    shadow_mode: true
  - key: internal
    rate_limit: {unlimited: true}
`

func TestCompareKnownAnswer(t *testing.T) {
	a := mustLoad(t, "api.yaml", diffOld)
	b := mustLoad(t, "api.yaml", diffNew, "web.yaml", "domain: web\n")
	got := Compare(a, b)
	want := &Diff{
		Domains: []DomainChange{{Kind: Added, Domain: "web"}},
		Rules: []RuleChange{
			{Kind: Removed, Domain: "api", Descriptor: "old", Resource: "api/old", OldLimit: "1 per 1h", OldSource: "api.yaml:10"},
			{Kind: Added, Domain: "api", Descriptor: "path=/login", Resource: "api/path=%2Flogin", NewLimit: "5 per 1m", NewSource: "api.yaml:6"},
			{Kind: Changed, Domain: "api", Descriptor: "user", Resource: "api/user", OldLimit: "100 per 1m", NewLimit: "50 per 1m, shadow",
				OldSource: "api.yaml:6", NewSource: "api.yaml:9", Changes: []FieldChange{
					{Field: "limit", Old: "100 per 1m", New: "50 per 1m"},
					{Field: "shadow_mode", Old: "false", New: "true"},
				}},
		},
		Moved: []Moved{{Domain: "api", Descriptor: "path=/login", From: "path", To: "path=/login"}},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("Compare (-want +got):\n%s", d)
	}
}

// TestCompareRoundTrips: a configuration compared with itself has no
// difference, and the difference from b to a mirrors that from a to b.
func TestCompareRoundTrips(t *testing.T) {
	pairs := []struct{ name, a, b string }{
		{"edits", diffOld, diffNew},
		{"wildcards", `
domain: api
descriptors:
  - key: file
    value: "img/*"
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: file
    rate_limit: {unit: second, requests_per_unit: 30}
`, `
domain: api
ignore_limits: true
descriptors:
  - key: file
    value: "img/*"
    tiers: [{limit: 3, window: 1s}, {limit: 6, window: 1s, active: 10s, cooldown: 1m}]
    hard_limit: 20
  - key: file
    value: "*"
    token_bucket: {capacity: 10, refill: 1, per: 1s}
`},
		{"nested and overrides", `
domain: edge
descriptors:
  - key: path
    value: /api
    descriptors:
      - key: remote_address
        rate_limit: {unit: second, requests_per_unit: 5}
        overrides: [{domain: 10.0.0.1, rate_limit: {unit: second, requests_per_unit: 50}}]
`, `
domain: edge
descriptors:
  - key: path
    descriptors:
      - key: remote_address
        rate_limit: {unit: second, requests_per_unit: 5, algorithm: fixed_window}
`},
	}
	for _, p := range pairs {
		t.Run(p.name, func(t *testing.T) {
			a := mustLoad(t, "f.yaml", p.a)
			b := mustLoad(t, "f.yaml", p.b)
			checkRoundTrip(t, a, b)
		})
	}
}

func checkRoundTrip(t *testing.T, a, b *Config) {
	t.Helper()
	for _, c := range []*Config{a, b} {
		if d := Compare(c, c); !d.Empty() {
			t.Errorf("a configuration differs from itself: %+v", d)
		}
	}
	ab, ba := Compare(a, b), Compare(b, a)
	if d := cmp.Diff(mirror(ab), ba); d != "" {
		t.Errorf("Compare(b, a) is not Compare(a, b) mirrored (-mirrored +reversed):\n%s", d)
	}
	if d := cmp.Diff(ab, mirror(mirror(ab))); d != "" {
		t.Errorf("mirroring twice changes the diff:\n%s", d)
	}
}

// TestCompareRandomRoundTrips draws pairs of small configurations.
func TestCompareRandomRoundTrips(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 200 {
		a, b := randomConfig(r), randomConfig(r)
		ca, _, errA := load(t, Options{}, "r.yaml", a)
		cb, _, errB := load(t, Options{}, "r.yaml", b)
		if errA != nil || errB != nil {
			t.Fatalf("draw %d does not load: %v %v\n%s\n%s", i, errA, errB, a, b)
		}
		checkRoundTrip(t, ca, cb)
		if t.Failed() {
			t.Fatalf("draw %d:\n%s\n---\n%s", i, a, b)
		}
	}
}

func randomConfig(r *rand.Rand) string {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n")
	var level func(indent string, depth int)
	level = func(indent string, depth int) {
		used := map[string]bool{}
		for range 1 + r.IntN(3) {
			key := []string{"a", "b"}[r.IntN(2)]
			val := []string{"", "x", "y", "x*", "*"}[r.IntN(5)]
			if used[key+"="+val] {
				continue
			}
			used[key+"="+val] = true
			fmt.Fprintf(&b, "%s- key: %s\n", indent, key)
			if val != "" {
				fmt.Fprintf(&b, "%s  value: %q\n", indent, val)
			}
			switch r.IntN(5) {
			case 0:
				fmt.Fprintf(&b, "%s  rate_limit: {unlimited: true}\n", indent)
			case 1, 2:
				fmt.Fprintf(&b, "%s  rate_limit: {unit: second, requests_per_unit: %d}\n", indent, 1+r.IntN(3))
				if r.IntN(3) == 0 {
					fmt.Fprintf(&b, "%s  shadow_mode: true\n", indent)
				}
			}
			if depth < 2 && r.IntN(2) == 0 {
				fmt.Fprintf(&b, "%s  descriptors:\n", indent)
				level(indent+"    ", depth+1)
			}
		}
	}
	level("  ", 0)
	return b.String()
}

// TestCompareQuota: a calendar quota's change is a change of its rule.
func TestCompareQuota(t *testing.T) {
	a := mustLoad(t, "p.yaml", "domain: p\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 5}\n    quota: {limit: 100, period: month}\n")
	b := mustLoad(t, "p.yaml", "domain: p\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 5}\n    quota: {limit: 200, period: month, time_zone: Europe/Paris}\n")
	got := Compare(a, b)
	if len(got.Rules) != 1 || len(got.Rules[0].Changes) != 1 || got.Rules[0].Changes[0].Field != "quota" ||
		got.Rules[0].Changes[0].New != "quota 200 per month in Europe/Paris" {
		t.Fatalf("Compare: %+v, want the quota changed to 200 a month in Paris", got)
	}
}

// mirror returns the difference the other way round: Compare(b, a) is
// mirror(Compare(a, b)).
func mirror(d *Diff) *Diff {
	out := &Diff{Domains: []DomainChange{}, Rules: []RuleChange{}, Moved: []Moved{}}
	for _, c := range d.Domains {
		c.Kind = flip(c.Kind)
		c.Changes = mirrorFields(c.Changes)
		out.Domains = append(out.Domains, c)
	}
	for _, r := range d.Rules {
		r.Kind = flip(r.Kind)
		r.OldLimit, r.NewLimit = r.NewLimit, r.OldLimit
		r.OldSource, r.NewSource = r.NewSource, r.OldSource
		r.Changes = mirrorFields(r.Changes)
		out.Rules = append(out.Rules, r)
	}
	for _, m := range d.Moved {
		m.From, m.To = m.To, m.From
		out.Moved = append(out.Moved, m)
	}
	return out
}

func flip(kind string) string {
	switch kind {
	case Added:
		return Removed
	case Removed:
		return Added
	}
	return kind
}

func mirrorFields(fs []FieldChange) []FieldChange {
	if fs == nil {
		return nil
	}
	out := make([]FieldChange, len(fs))
	for i, f := range fs {
		out[i] = FieldChange{Field: f.Field, Old: f.New, New: f.Old}
	}
	return out
}
