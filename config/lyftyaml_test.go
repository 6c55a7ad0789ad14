package config

import (
	"errors"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/tiers"
)

// These tests hold the loader to what envoyproxy/ratelimit, which reads
// every file of its directory with gopkg.in/yaml.v2, makes of the same bytes.

// TestLoadEveryFile: envoyproxy/ratelimit loads every file of the directory,
// whatever its name; so does Charon (names starting with "." aside), so a
// directory of ratelimit.conf files is not silently empty.
func TestLoadEveryFile(t *testing.T) {
	fsys := fstest.MapFS{
		"ratelimit.conf": {Data: []byte("domain: conf\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")},
		"config":         {Data: []byte("domain: bare\n")},
		"limits.json":    {Data: []byte(`{"domain": "json", "descriptors": [{"key": "k", "rate_limit": {"unit": "minute", "requests_per_unit": 2}}]}`)},
		"sub/api.yml":    {Data: []byte("domain: yml\n")},
		"api.yaml":       {Data: []byte("domain: yaml\n")},
		".hidden.conf":   {Data: []byte("not: [yaml")},
		".git/HEAD":      {Data: []byte("ref: refs/heads/main\n")},
	}
	cfg, _, err := Load(fsys, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"api.yaml", "config", "limits.json", "ratelimit.conf", "sub/api.yml"}, cfg.Files); diff != "" {
		t.Errorf("files (-want +got):\n%s", diff)
	}
	for _, d := range []string{"conf", "bare", "json", "yml", "yaml"} {
		if _, ok := cfg.Tree.Domain(d); !ok {
			t.Errorf("domain %q not loaded", d)
		}
	}
	for _, d := range []string{"conf", "json"} {
		if m, ok := cfg.Tree.Match(d, e("k", "x")); !ok || m.Policy == nil || len(m.Policy.Tiers) != 1 {
			t.Errorf("%s: got match %+v, %v, want one tier", d, m, ok)
		}
	}
}

// TestLoadFileNotYAML: a file that is not a domain's YAML is an error naming
// it, as in envoyproxy/ratelimit, not a file quietly left out.
func TestLoadFileNotYAML(t *testing.T) {
	tests := []struct {
		name  string
		files fstest.MapFS
		want  []string
	}{
		{"README", fstest.MapFS{"README.md": {Data: []byte("# Limits\n\nOne file per domain.\n")}},
			[]string{`README.md:3: must be a mapping with domain and descriptors, not "One file per domain."`}},
		{"text", fstest.MapFS{"notes.txt": {Data: []byte("not yaml")}},
			[]string{`notes.txt:1: must be a mapping with domain and descriptors, not "not yaml"`}},
		{"empty", fstest.MapFS{"ratelimit.conf": {Data: nil}},
			[]string{"ratelimit.conf: domain: empty domain: the file has no configuration"}},
		{"backup beside the original", fstest.MapFS{
			"api.conf":     {Data: []byte("domain: api\n")},
			"api.conf.bak": {Data: []byte("domain: api\n")},
		}, []string{`api.conf.bak:1: domain: duplicate domain "api": already defined in api.conf:1 (enable domain merging to merge them)`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := Load(tt.files, Options{})
			if err == nil {
				t.Fatal("loaded, want an error")
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("not ErrInvalid: %v", err)
			}
			if diff := cmp.Diff(tt.want, strings.Split(err.Error(), "\n")); diff != "" {
				t.Errorf("errors (-want +got):\n%s", diff)
			}
		})
	}
}

// loadLeaf loads one file of domain d whose single descriptor, key k, has
// the given lines, and returns what a request {k: x} matches.
func loadLeaf(t *testing.T, lines string) (descriptors.Match, bool, []Warning) {
	t.Helper()
	cfg, warns, err := load(t, Options{}, "api.yaml", "domain: d\ndescriptors:\n  - key: k\n"+lines)
	if err != nil {
		t.Fatalf("refused: %v", err)
	}
	m, ok := cfg.Tree.Match("d", e("k", "x"))
	return m, ok, warns
}

// TestLoadYAML11Flags: every word yaml.v2 reads as a boolean is one, in
// every flag envoyproxy/ratelimit has.
func TestLoadYAML11Flags(t *testing.T) {
	words := map[string]bool{
		"y": true, "Y": true, "yes": true, "Yes": true, "YES": true,
		"true": true, "True": true, "TRUE": true,
		"on": true, "On": true, "ON": true,
		"n": false, "N": false, "no": false, "No": false, "NO": false,
		"false": false, "False": false, "FALSE": false,
		"off": false, "Off": false, "OFF": false,
	}
	flags := []struct {
		key string
		get func(l *descriptors.Limit) bool
	}{
		{"shadow_mode", func(l *descriptors.Limit) bool { return l.ShadowMode }},
		{"quota_mode", func(l *descriptors.Limit) bool { return l.QuotaMode }},
		{"detailed_metric", func(l *descriptors.Limit) bool { return l.DetailedMetric }},
	}
	for word, want := range words {
		for _, f := range flags {
			m, ok, _ := loadLeaf(t, "    rate_limit: {unit: second, requests_per_unit: 1}\n    "+f.key+": "+word+"\n")
			if !ok {
				t.Fatalf("%s: %s: no match", f.key, word)
			}
			if got := f.get(m.Limit); got != want {
				t.Errorf("%s: %s: got %v, want %v", f.key, word, got, want)
			}
		}
		rl := "    rate_limit: {unlimited: " + word + "}\n"
		if !want {
			rl = "    rate_limit: {unlimited: " + word + ", unit: second, requests_per_unit: 1}\n"
		}
		m, ok, _ := loadLeaf(t, rl)
		if !ok || m.Limit.Unlimited != want {
			t.Errorf("unlimited: %s: got %+v, %v, want unlimited %v", word, m.Limit, ok, want)
		}
	}
}

// TestLoadEmptyValues: an empty value is what yaml.v2 makes of it, the zero
// value of the field: no flag, no limit, no metadata, a limit of 0.
func TestLoadEmptyValues(t *testing.T) {
	t.Run("flags", func(t *testing.T) {
		m, ok, _ := loadLeaf(t, "    rate_limit: {unit: second, requests_per_unit: 1}\n    shadow_mode:\n    quota_mode: ~\n    detailed_metric: null\n    value_to_metric:\n    metadata:\n")
		if !ok {
			t.Fatal("no match")
		}
		l := m.Limit
		if l.ShadowMode || l.QuotaMode || l.DetailedMetric || l.Metadata != nil {
			t.Errorf("got shadow %v, quota %v, detailed %v, metadata %v; want false, false, false, nil", l.ShadowMode, l.QuotaMode, l.DetailedMetric, l.Metadata)
		}
	})
	t.Run("rate_limit", func(t *testing.T) {
		if m, ok, _ := loadLeaf(t, "    rate_limit:\n    shadow_mode: true\n"); ok {
			t.Errorf("got limit %+v, want none", m.Limit)
		}
	})
	t.Run("requests_per_unit", func(t *testing.T) {
		m, ok, warns := loadLeaf(t, "    rate_limit:\n      unit: second\n      requests_per_unit:\n")
		if !ok || m.Policy == nil || m.Policy.Kind != tiers.KindFixedWindow || m.Policy.Window.Limit != 0 {
			t.Fatalf("got %+v, %v, want a fixed window of 0 (every request rejected)", m.Policy, ok)
		}
		want := []string{"api.yaml:6: descriptors[0].rate_limit.requests_per_unit: empty: 0, every request is rejected"}
		var got []string
		for _, w := range warns {
			got = append(got, w.String())
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("warnings (-want +got):\n%s", diff)
		}
	})
}

// TestLoadMergeKeys: <<: *anchor is expanded as yaml.v2 expands it.
func TestLoadMergeKeys(t *testing.T) {
	text := `domain: d
descriptors:
  - &base
    key: a
    rate_limit: {unit: minute, requests_per_unit: 10}
    shadow_mode: true
    metadata: {team: payments, tier: 1}
  - <<: *base
    key: b
  - <<: *base
    key: c
    shadow_mode: false
    rate_limit: {requests_per_unit: 1000}
    metadata: {tier: 2}
  - <<: [{key: first, shadow_mode: yes}, {key: second, quota_mode: yes}]
    key: list
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: t
    tiers:
      - &t1 {limit: 5, window: 1s}
      - <<: *t1
        limit: 20
        active: 5s
  - key: rl
    rate_limit:
      <<: &rl {unit: second, requests_per_unit: 7}
      requests_per_unit: 8
`
	cfg, warns, err := load(t, Options{}, "api.yaml", text)
	if err != nil {
		t.Fatal(err)
	}
	if len(warns) != 0 {
		t.Errorf("warnings: %v", warns)
	}
	type leaf struct {
		Shadow, Quota bool
		Tiers         []tiers.Tier
		Metadata      map[string]any
	}
	minute := func(l int64) []tiers.Tier {
		return []tiers.Tier{{Limit: l, Window: time.Minute, Active: tiers.Unbounded}}
	}
	tests := []struct {
		key  string
		want leaf
	}{
		{"a", leaf{Shadow: true, Tiers: minute(10), Metadata: map[string]any{"team": "payments", "tier": int64(1)}}},
		{"b", leaf{Shadow: true, Tiers: minute(10), Metadata: map[string]any{"team": "payments", "tier": int64(1)}}},
		// yaml.v2 decodes a mapping given again into the same struct or
		// map: rate_limit and metadata keep the merged keys not given.
		{"c", leaf{Shadow: false, Tiers: minute(1000), Metadata: map[string]any{"team": "payments", "tier": int64(2)}}},
		// Of a list of mappings, the first wins; the key given wins over both.
		{"list", leaf{Shadow: true, Quota: true, Tiers: []tiers.Tier{{Limit: 1, Window: time.Second, Active: tiers.Unbounded}}}},
		{"t", leaf{Tiers: []tiers.Tier{{Limit: 5, Window: time.Second, Active: tiers.Unbounded}, {Limit: 20, Window: time.Second, Active: 5 * time.Second}}}},
		{"rl", leaf{Tiers: []tiers.Tier{{Limit: 8, Window: time.Second, Active: tiers.Unbounded}}}},
	}
	for _, tt := range tests {
		m, ok := cfg.Tree.Match("d", e(tt.key, "x"))
		if !ok {
			t.Errorf("%s: no match", tt.key)
			continue
		}
		got := leaf{Shadow: m.Limit.ShadowMode, Quota: m.Limit.QuotaMode, Metadata: m.Limit.Metadata}
		if m.Policy != nil {
			got.Tiers = m.Policy.Tiers
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tt.key, diff)
		}
	}
}

// TestLoadMergeAfterKeys: yaml.v2 reads a mapping's keys in order, so a
// merge after a key replaces it; Charon reads it so and warns, as YAML's
// merge-key spec (and yaml.v3) keep the key given.
func TestLoadMergeAfterKeys(t *testing.T) {
	m, ok, warns := loadLeaf(t, `    metadata: {limits: &rl {unit: second, requests_per_unit: 7}}
    rate_limit:
      requests_per_unit: 8
      <<: *rl
`)
	if !ok || m.Policy == nil || len(m.Policy.Tiers) != 1 || m.Policy.Tiers[0].Limit != 7 {
		t.Fatalf("got %+v, %v, want a limit of 7", m.Policy, ok)
	}
	want := []string{"api.yaml:6: descriptors[0].rate_limit.requests_per_unit: replaced by the merge (<<) after it, as envoyproxy/ratelimit reads it: write <<: before the keys that override it"}
	var got []string
	for _, w := range warns {
		got = append(got, w.String())
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("warnings (-want +got):\n%s", diff)
	}
}

func TestLoadMergeKeyErrors(t *testing.T) {
	tests := []struct {
		name string
		text string
		want []string
	}{
		{"unknown key merged in, at its own line", `
domain: api
descriptors:
  - key: a
    metadata: &m {bogus: 1}
  - <<: *m
    key: b
`, []string{`api.yaml:5: descriptors[1].bogus: unknown key "bogus"`}},
		{"merge of a scalar", `
domain: api
descriptors:
  - key: a
    <<: 5
`, []string{`api.yaml:5: descriptors[0].<<: must be a mapping or a list of mappings to merge, not "5"`}},
		{"merge of a list of scalars", `
domain: api
descriptors:
  - key: a
    <<: [{shadow_mode: true}, x]
`, []string{`api.yaml:5: descriptors[0].<<[1]: must be a mapping to merge, not "x"`}},
		{"a key given twice is still an error", `
domain: api
descriptors:
  - &a {key: a}
  - <<: *a
    key: b
    key: c
`, []string{"api.yaml:7: descriptors[1].key: key given twice (first at line 6)"}},
		{"an anchor merged into itself", `
domain: api
descriptors:
  - &a {key: k, <<: [*a]}
`, []string{"api.yaml:4: descriptors[0].<<: merges a mapping into itself (an alias inside its own anchor)"}},
		{"missing is checked after merging", `
domain: api
descriptors:
  - key: a
    tiers:
      - <<: {limit: 1}
        active: 1s
`, []string{"api.yaml:6: descriptors[0].tiers[0].window: missing"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := load(t, Options{}, "api.yaml", tt.text)
			if err == nil {
				t.Fatal("loaded, want an error")
			}
			if diff := cmp.Diff(tt.want, strings.Split(err.Error(), "\n")); diff != "" {
				t.Errorf("errors (-want +got):\n%s", diff)
			}
		})
	}
}

// TestLoadMetadataAsLyft: metadata is what yaml.v2 and envoyproxy/ratelimit's
// conversion to a protobuf Struct make of it: YAML 1.1 scalars, dates kept as
// text, keys of nested mappings written out as their values print.
func TestLoadMetadataAsLyft(t *testing.T) {
	m, ok, _ := loadLeaf(t, `    rate_limit: {unit: second, requests_per_unit: 5}
    metadata:
      since: 2001-12-14
      enabled: yes
      count: 0x1F
      ratio: 1.50
      none: ~
      quoted: "yes"
      429: top
      yes: top-level keys stay as written
      codes: {429: slow down, 0x1F: hex, yes: affirmative, ~: nothing, 1.50: ratio, 2001-12-14: date}
      list: [on, 1_000, "2", {a: b}]
      merged:
        <<: {team: payments, tier: 1}
        tier: 2
`)
	if !ok {
		t.Fatal("no match")
	}
	want := map[string]any{
		"since":   "2001-12-14",
		"enabled": true,
		"count":   int64(31),
		"ratio":   1.5,
		"none":    nil,
		"quoted":  "yes",
		"429":     "top",
		"yes":     "top-level keys stay as written",
		"codes":   map[string]any{"429": "slow down", "31": "hex", "true": "affirmative", "<nil>": "nothing", "1.5": "ratio", "2001-12-14": "date"},
		"list":    []any{true, int64(1000), "2", map[string]any{"a": "b"}},
		"merged":  map[string]any{"team": "payments", "tier": int64(2)},
	}
	if diff := cmp.Diff(want, m.Limit.Metadata); diff != "" {
		t.Errorf("metadata (-want +got):\n%s", diff)
	}
}

func TestLoadMetadataErrors(t *testing.T) {
	tests := []struct {
		name string
		meta string
		want string
	}{
		{"not a mapping", "[a]", `api.yaml:4: descriptors[0].metadata: must be a mapping, not a list`},
		{"bad tag", "{a: !!int x}", `api.yaml:4: descriptors[0].metadata.a: "x" is not a valid int`},
		{"key twice", "{a: 1, a: 2}", `api.yaml:4: descriptors[0].metadata.a: key given twice (first at line 4)`},
		{"nested keys the same once written out", "{c: {yes: 1, true: 2}}", `api.yaml:4: descriptors[0].metadata.c.true: key given twice (first at line 4)`},
		{"an alias inside its own anchor", "&m {a: [*m]}", `api.yaml:4: descriptors[0].metadata.a[0]: contains itself (an alias inside its own anchor)`},
		{"a mapping as a key", "{? {a: 1} : 2}", `api.yaml:4: descriptors[0].metadata: a key must be a scalar, not a mapping`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := load(t, Options{}, "api.yaml", "domain: d\ndescriptors:\n  - key: k\n    metadata: "+tt.meta+"\n    rate_limit: {unit: second, requests_per_unit: 5}\n")
			if err == nil || err.Error() != tt.want {
				t.Errorf("got error %v, want %s", err, tt.want)
			}
		})
	}
}
