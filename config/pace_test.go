package config

import (
	"strings"
	"testing"
	"time"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/tiers"
)

func TestLoadPace(t *testing.T) {
	text := `domain: api
descriptors:
  - key: plain
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: paced
    rate_limit: {unit: second, requests_per_unit: 10}
    pace: 200ms
  - key: bucket
    token_bucket: {capacity: 5, refill: 1, per: 1s}
    pace: 10s
  - key: planned
    rate_limit: {unit: second, requests_per_unit: 10}
    quota: {limit: 100, period: day}
    pace: 1s
`
	cfg, _, err := load(t, Options{}, "api.yaml", text)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		key  string
		want time.Duration
	}{{"plain", 0}, {"paced", 200 * time.Millisecond}, {"bucket", 10 * time.Second}, {"planned", time.Second}} {
		m, ok := cfg.Tree.Match("api", []descriptors.Entry{{Key: tc.key, Value: "x"}})
		if !ok || m.Limit == nil {
			t.Fatalf("%s: no match", tc.key)
		}
		if m.Limit.Pace != tc.want {
			t.Errorf("%s: got Pace %v, want %v", tc.key, m.Limit.Pace, tc.want)
		}
	}
	// A fixed window paces, by its algorithm or server-wide.
	for _, tc := range []struct {
		name string
		opts Options
		rl   string
	}{
		{"algorithm", Options{}, "{unit: second, requests_per_unit: 5, algorithm: fixed_window}"},
		{"--fixed-window", Options{FixedWindowDefault: true}, "{unit: second, requests_per_unit: 5}"},
	} {
		c, _, err := load(t, tc.opts, "api.yaml", "domain: api\ndescriptors:\n  - key: a\n    rate_limit: "+tc.rl+"\n    pace: 2s\n")
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		m, _ := c.Tree.Match("api", []descriptors.Entry{{Key: "a"}})
		if m.Limit.Policy.Kind != tiers.KindFixedWindow || m.Limit.Pace != 2*time.Second {
			t.Errorf("%s: got %v paced %v, want a fixed window paced 2s", tc.name, m.Limit.Policy.Kind, m.Limit.Pace)
		}
	}
	// Pacing is how answers are given, not how hits are counted: the
	// state is the same with and without it.
	a, _, _ := load(t, Options{}, "api.yaml", "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 10}\n")
	b, _, _ := load(t, Options{}, "api.yaml", "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 10}\n    pace: 200ms\n")
	ma, _ := a.Tree.Match("api", []descriptors.Entry{{Key: "a"}})
	mb, _ := b.Tree.Match("api", []descriptors.Entry{{Key: "a"}})
	if ma.Limit.ID != mb.Limit.ID {
		t.Errorf("pace changed the policy ID: %x, %x", ma.Limit.ID, mb.Limit.ID)
	}

	for _, tc := range []struct{ name, text, want string }{
		{"not a duration", "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n    pace: soon\n", "api.yaml:5: descriptors[0].pace: must be a duration"},
		{"no unit", "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n    pace: 200\n", "api.yaml:5: descriptors[0].pace: must be a duration"},
		{"zero", "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n    pace: 0s\n", "api.yaml:5: descriptors[0].pace: must be > 0"},
		{"negative", "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n    pace: -1s\n", "api.yaml:5: descriptors[0].pace: must be >= 0"},
		{"too long", "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n    pace: 11s\n", "api.yaml:5: descriptors[0].pace: must be at most 10s"},
		{"no policy", "domain: api\ndescriptors:\n  - key: a\n    pace: 1s\n", "api.yaml:4: descriptors[0].pace: needs a policy"},
		{"unlimited", "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true}\n    pace: 1s\n", "api.yaml:5: descriptors[0].pace: applies only to"},
		{"copies", "domain: api\ndescriptors:\n  - key: a\n    copies: {domain_limit: 2}\n    pace: 1s\n", "api.yaml:5: descriptors[0].pace: applies only to"},
		{"quota alone", "domain: api\ndescriptors:\n  - key: a\n    quota: {limit: 5, period: day}\n    pace: 1s\n", "api.yaml:5: descriptors[0].pace: needs a rate policy"},
		{"tier stack", "domain: api\ndescriptors:\n  - key: a\n    tiers: [{limit: 1, window: 1s}, {limit: 2, window: 1s, active: 5s, cooldown: 5s}]\n    pace: 1s\n", "api.yaml:5: descriptors[0].pace: cannot pace: a stack of several tiers"},
		{"post-paid", "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n    overdraft: true\n    pace: 1s\n", "api.yaml:6: descriptors[0].pace: cannot pace: a post-paid"},
	} {
		_, _, err := load(t, Options{}, "api.yaml", tc.text)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got error %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}
