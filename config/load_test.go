package config

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/tiers"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

func load(t *testing.T, opts Options, files ...string) (*Config, []Warning, error) {
	t.Helper()
	fsys := fstest.MapFS{}
	for i := 0; i+1 < len(files); i += 2 {
		fsys[files[i]] = &fstest.MapFile{Data: []byte(files[i+1])}
	}
	return Load(fsys, opts)
}

func TestLoadErrors(t *testing.T) {
	tests := []struct {
		name string
		text string
		want []string // every line of the error, in order
	}{
		{"tier window zero", `
domain: api
descriptors:
  - key: a
  - key: b
  - key: user
    tiers:
      - limit: 5
        window: 0s
`, []string{"api.yaml:9: descriptors[2].tiers[0].window: must be > 0"}},
		{"every problem at once", `
domain: api
descriptors:
  - key: a
    tiers: [{limit: 0, window: 1x}]
  - key: b
    rate_limit: {unit: fortnight, requests_per_unit: -1}
  - key: c
    bogus: 1
`, []string{
			"api.yaml:5: descriptors[0].tiers[0].limit: must be >= 1",
			`api.yaml:5: descriptors[0].tiers[0].window: must be a duration such as 1s, 5m or 24h, not "1x"`,
			`api.yaml:7: descriptors[1].rate_limit.unit: invalid rate limit unit "fortnight": use second, minute, hour, day, week, month or year`,
			"api.yaml:7: descriptors[1].rate_limit.requests_per_unit: must be >= 0",
			`api.yaml:9: descriptors[2].bogus: unknown key "bogus"`,
		}},
		{"two policies", `
domain: api
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1}
    tiers: [{limit: 1, window: 1s}]
`, []string{"api.yaml:6: descriptors[0].tiers: a descriptor has exactly one policy: rate_limit and tiers both given"}},
		{"hard limit without policy", `
domain: api
descriptors:
  - key: a
    hard_limit: 5
`, []string{"api.yaml:5: descriptors[0].hard_limit: needs a policy on the same descriptor (rate_limit, tiers, token_bucket, concurrency or copies)"}},
		{"hard limit on fixed window", `
domain: api
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: fixed_window}
    hard_limit: 5
`, []string{"api.yaml:6: descriptors[0].hard_limit: applies only to tiers and to a sliding-window rate_limit"}},
		{"duration without unit", `
domain: api
descriptors:
  - key: a
    token_bucket: {capacity: 10, refill: 1, per: 60}
`, []string{`api.yaml:5: descriptors[0].token_bucket.per: must be a duration such as 1s, 5m or 24h, not "60" (give a unit: 60s?)`}},
		{"bad override", `
domain: api
descriptors:
  - key: user
    tiers: [{limit: 1, window: 1s}]
    overrides:
      - domain: alice
        tiers: [{limit: 2, window: 1s}]
      - domain: alice
        tiers: [{limit: 3, window: 1s}]
      - tiers: [{limit: 3, window: 1s}]
`, []string{
			`api.yaml:9: descriptors[0].overrides[1].domain: domain "alice" already overridden at line 7`,
			"api.yaml:11: descriptors[0].overrides[2].domain: missing: name the Charon domain this override is for",
		}},
		{"key twice and non-bool", `
domain: api
domain: other
ignore_limits: yes please
`, []string{
			"api.yaml:3: domain: key given twice (first at line 2)",
			`api.yaml:4: ignore_limits: must be true or false, not "yes please"`,
		}},
		{"copies groups", `
domain: api
descriptors:
  - key: lic
    copies:
      domain_limit: 2
      groups:
        - {name: g, limit: 1, members: [a]}
        - {name: g, members: [""]}
`, []string{
			"api.yaml:9: descriptors[0].copies.groups[1].members[0]: empty member",
			`api.yaml:9: descriptors[0].copies.groups[1].name: group "g" given twice`,
			"api.yaml:9: descriptors[0].copies.groups[1].limit: missing",
		}},
		{"two documents", "domain: a\n---\ndomain: b\n", []string{"api.yaml:2: more than one YAML document in the file"}},
		{"not a mapping", "- a\n", []string{"api.yaml:1: must be a mapping with domain and descriptors, not a list"}},
		{"anchors and aliases keep their lines", `
domain: api
descriptors:
  - key: k
    rate_limit: &rl {unit: second, requests_per_unit: 1}
  - key: &x k2
    rate_limit: *rl
    bogus: 1
`, []string{`api.yaml:8: descriptors[1].bogus: unknown key "bogus"`}},
		{"invalid YAML", "domain: a\ndescriptors:\n  - key: k\n  bad\n", []string{"api.yaml:4: invalid YAML: could not find expected ':'"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := load(t, Options{}, "api.yaml", tt.text)
			if err == nil {
				t.Fatal("loaded, want an error")
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("not ErrInvalid: %v", err)
			}
			got := strings.Split(err.Error(), "\n")
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("errors (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMergeDuplicatePath(t *testing.T) {
	_, _, err := load(t, Options{MergeDomains: true},
		"a.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
		"b.yaml", "domain: d\ndescriptors:\n  - key: x\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 2}\n")
	want := `b.yaml:4: descriptors[1]: duplicate descriptor: key "k" value "" already at a.yaml:3`
	if err == nil || err.Error() != want {
		t.Fatalf("got error %v, want %s", err, want)
	}
}

func TestLoadPolicies(t *testing.T) {
	text := `domain: api
ignore_limits: true
descriptors:
  - key: sliding
    rate_limit: {unit: MINUTE, requests_per_unit: 10}
    hard_limit: 3
    global_limit: 100
  - key: fixed
    rate_limit: {unit: day, requests_per_unit: 10, algorithm: fixed_window}
  - key: banned
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: free
    rate_limit: {unlimited: true}
  - key: penalties
    tiers:
      - {limit: 5, window: 1s}
      - {limit: 20, window: 1s, active: 5s, cooldown: 15s, skippable: true}
  - key: bucket
    token_bucket: {capacity: 100, refill: 6, per: 1m}
  - key: user
    tiers: [{limit: 1, window: 1s}]
    global_limit: 50
    overrides:
      - domain: alice
        tiers: [{limit: 10, window: 1s}]
      - domain: a/b
        rate_limit: {unit: second, requests_per_unit: 7}
        hard_limit: 2
`
	cfg, warns, err := load(t, Options{}, "api.yaml", text)
	if err != nil {
		t.Fatal(err)
	}
	if len(warns) != 0 {
		t.Errorf("warnings: %v", warns)
	}
	unb := tiers.Unbounded
	tests := []struct {
		entries   []string
		want      *tiers.Policy
		unlimited bool
	}{
		{[]string{"sliding", "x"}, &tiers.Policy{Tiers: []tiers.Tier{{Limit: 10, Window: time.Minute, Active: unb}}, HardLimit: 3, GlobalLimit: 100}, false},
		{[]string{"fixed", "x"}, &tiers.Policy{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Limit: 10, Unit: tiers.UnitDay}}, false},
		{[]string{"banned", "x"}, &tiers.Policy{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Unit: tiers.UnitSecond}}, false},
		{[]string{"free", "x"}, nil, true},
		{[]string{"penalties", "x"}, &tiers.Policy{Tiers: []tiers.Tier{{Limit: 5, Window: time.Second, Active: unb}, {Limit: 20, Window: time.Second, Active: 5 * time.Second, Cooldown: 15 * time.Second, Skippable: true}}}, false},
		{[]string{"bucket", "x"}, &tiers.Policy{Kind: tiers.KindTokenBucket, Bucket: tiers.TokenBucket{Capacity: 100, Refill: 6, Per: time.Minute}}, false},
		{[]string{"user", "bob"}, &tiers.Policy{Tiers: []tiers.Tier{{Limit: 1, Window: time.Second, Active: unb}}, GlobalLimit: 50}, false},
		{[]string{"user", "alice"}, &tiers.Policy{Tiers: []tiers.Tier{{Limit: 10, Window: time.Second, Active: unb}}, GlobalLimit: 50}, false},
		{[]string{"user", "a/b"}, &tiers.Policy{Tiers: []tiers.Tier{{Limit: 7, Window: time.Second, Active: unb}}, HardLimit: 2, GlobalLimit: 50}, false},
	}
	for _, tt := range tests {
		m, ok := cfg.Tree.Match("api", e(tt.entries...))
		if !ok {
			t.Errorf("%v: no match", tt.entries)
			continue
		}
		if m.Limit.Unlimited != tt.unlimited {
			t.Errorf("%v: unlimited = %v", tt.entries, m.Limit.Unlimited)
		}
		if diff := cmp.Diff(tt.want, m.Policy); diff != "" {
			t.Errorf("%v: policy (-want +got):\n%s", tt.entries, diff)
		}
	}
	if d, _ := cfg.Tree.Domain("api"); !d.IgnoreLimits || d.AllowUnconfigured {
		t.Errorf("domain config = %+v", d)
	}
}

func TestLoadWarnings(t *testing.T) {
	text := `domain: api
descriptors:
  - key: user
    tiers:
      - {limit: 5, window: 1s, active: 0s}
      - {limit: 5, window: 10s, active: 5s}
      - {limit: 5, window: 10s, active: 25s}
  - key: lic
    copies:
      domain_limit: 10
      global_limit: 4
      groups: [{name: g, limit: 9, members: [a, b]}]
`
	cfg, warns, err := load(t, Options{}, "api.yaml", text)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, w := range warns {
		got = append(got, w.String())
	}
	want := []string{
		"api.yaml:5: descriptors[0].tiers[0]: removed (active 0)",
		"api.yaml:6: descriptors[0].tiers[1]: window 10s cut to active 5s",
		"api.yaml:7: descriptors[0].tiers[2]: active 25s cut to 20s (whole windows of 10s)",
		"api.yaml:10: descriptors[1].copies.domain_limit: domain_limit 10 above global_limit 4: lowered to 4",
		"api.yaml:10: descriptors[1].copies.groups[0].limit: group limit 9 above global_limit 4: lowered to 4",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("warnings (-want +got):\n%s", diff)
	}
	m, _ := cfg.Tree.Match("api", e("user", "u"))
	wantTiers := []tiers.Tier{{Limit: 5, Window: 5 * time.Second, Active: 5 * time.Second}, {Limit: 5, Window: 10 * time.Second, Active: 20 * time.Second}}
	if diff := cmp.Diff(wantTiers, m.Policy.Tiers); diff != "" {
		t.Errorf("tiers (-want +got):\n%s", diff)
	}
	m, _ = cfg.Tree.Match("api", e("lic", "x"))
	if m.Limit.Copies.DomainLimit != 4 || m.Limit.Copies.Groups[0].Limit != 4 {
		t.Errorf("copies not lowered: %+v", m.Limit.Copies)
	}
}

func TestLoadMatchShareThreshold(t *testing.T) {
	for _, f := range lyftFiles(t, "valid") {
		if filepath.Base(f) != "share_threshold.yaml" {
			continue
		}
		cfg, _, err := Load(mapFS(t, f), Options{})
		if err != nil {
			t.Fatal(err)
		}
		tests := []struct {
			entries          []string
			limit            int64
			resource, domain string
		}{
			{[]string{"files", "files/a"}, 100, "test-domain/files=files%2F*", ""},
			{[]string{"files", "files/b"}, 100, "test-domain/files=files%2F*", ""},
			{[]string{"file", "test1"}, 50, "test-domain/file=test1", ""},
			{[]string{"file", "test2"}, 100, "test-domain/file=test*", ""},
			{[]string{"path", "path/x", "file", "file/y", "type", "t"}, 120, "test-domain/path=path%2F*/file=file%2F*/type", "file%2Fy,t"},
			{[]string{"route", "api/v1", "method", "GET"}, 60, "test-domain/route=api%2F*/method", "GET"},
		}
		for _, tt := range tests {
			m, ok := cfg.Tree.Match("test-domain", e(tt.entries...))
			if !ok {
				t.Errorf("%v: no match", tt.entries)
				continue
			}
			if m.Policy.Tiers[0].Limit != tt.limit || m.Resource != tt.resource || m.Domain != tt.domain {
				t.Errorf("%v: got (%d, %q, %q), want (%d, %q, %q)", tt.entries, m.Policy.Tiers[0].Limit, m.Resource, m.Domain, tt.limit, tt.resource, tt.domain)
			}
		}
	}
}

func TestLoadFilesAndSymlinks(t *testing.T) {
	dir := t.TempDir()
	ts := filepath.Join(dir, "..2024_01_01_00_00_00.123")
	must(t, os.MkdirAll(filepath.Join(ts, "sub"), 0o755))
	must(t, os.WriteFile(filepath.Join(ts, "a.yaml"), []byte("domain: a\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(ts, "b.yml"), []byte("domain: b\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(ts, "notes.txt"), []byte("domain: notes\n"), 0o644))
	must(t, os.Symlink(filepath.Base(ts), filepath.Join(dir, "..data")))
	must(t, os.Symlink("..data/a.yaml", filepath.Join(dir, "a.yaml")))
	must(t, os.Symlink("..data/b.yml", filepath.Join(dir, "b.yml")))
	must(t, os.Symlink("..data/notes.txt", filepath.Join(dir, "notes.txt")))
	must(t, os.Symlink("..data", filepath.Join(dir, "loop.yaml"))) // a directory: skipped
	must(t, os.MkdirAll(filepath.Join(dir, "nested"), 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "nested", "c.yaml"), []byte("domain: c\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, ".hidden.yaml"), []byte("domain: a\n"), 0o644))
	cfg, _, err := Load(os.DirFS(dir), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"a.yaml", "b.yml", "nested/c.yaml", "notes.txt"}, cfg.Files); diff != "" {
		t.Errorf("files (-want +got):\n%s", diff)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestDumpGolden(t *testing.T) {
	dir := filepath.Join("testdata", "dump")
	inputs, err := filepath.Glob(filepath.Join(dir, "*.in.yaml"))
	if err != nil || len(inputs) == 0 {
		t.Fatalf("no inputs in %s: %v", dir, err)
	}
	for _, in := range inputs {
		name := strings.TrimSuffix(filepath.Base(in), ".in.yaml")
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(in)
			must(t, err)
			cfg, warns, err := Load(fstest.MapFS{name + ".yaml": {Data: data}}, Options{})
			must(t, err)
			out, err := cfg.Dump()
			must(t, err)
			var b strings.Builder
			for _, w := range warns {
				fmt.Fprintf(&b, "# warning: %s\n", w)
			}
			b.Write(out)
			golden := filepath.Join(dir, name+".golden")
			if *update {
				must(t, os.WriteFile(golden, []byte(b.String()), 0o644))
			}
			want, err := os.ReadFile(golden)
			must(t, err)
			if diff := cmp.Diff(string(want), b.String()); diff != "" {
				t.Errorf("dump differs from %s (-want +got; go test -update to rewrite):\n%s", golden, diff)
			}
			again, _ := cfg.Dump()
			if string(again) != string(out) {
				t.Error("Dump is not stable")
			}
		})
	}
}

func TestDumpLyftExamples(t *testing.T) {
	for _, f := range lyftFiles(t, "examples") {
		cfg, _, err := Load(mapFS(t, f), Options{})
		must(t, err)
		if _, err := cfg.Dump(); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

func FuzzLoad(f *testing.F) {
	f.Add([]byte("domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"))
	f.Add([]byte("domain: a\ndescriptors:\n  - key: k\n    tiers: [{limit: 1, window: 1s, active: 0s}]\n    overrides: [{domain: x, tiers: []}]\n"))
	f.Add([]byte("domain: a\ndescriptors:\n  - key: k\n    copies: {domain_limit: 3, global_limit: 1, groups: [{name: g, limit: 2, members: [a]}]}\n"))
	f.Add([]byte("a: &a [*a]\n"))
	f.Add([]byte("domain: d\ndescriptors:\n  - &a {key: k, <<: [*a, *a]}\n"))
	f.Add([]byte("domain: d\ndescriptors:\n  - key: k\n    metadata: &m {a: *m, b: *m, <<: [*m, *m]}\n"))
	f.Add([]byte("domain: d\ndescriptors:\n  - &b {key: k, rate_limit: {unit: second}}\n  - <<: *b\n    key: j\n    rate_limit: {<<: *b, requests_per_unit: yes}\n"))
	f.Add([]byte("domain: a\ndescriptors:\n  - key: k\n    concurrency: {limit: 2, ttl: 30s}\n    overrides: [{domain: x, concurrency: {limit: 5, ttl: 1m}}]\n"))
	f.Add([]byte("domain: a\ndescriptors:\n  - key: k\n    concurrency: {limit: 0, ttl: 0s}\n    pace: 1s\n    quota: {limit: 1, period: day}\n"))
	f.Add([]byte("'''"))
	f.Add([]byte("---\n---\n0: 0"))
	for _, fl := range []string{"valid", "examples", "invalid"} {
		m, _ := filepath.Glob(filepath.Join(lyftDir, fl, "*.yaml"))
		for _, p := range m {
			if data, err := os.ReadFile(p); err == nil {
				f.Add(data)
			}
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, _, err := Load(fstest.MapFS{"f.yaml": {Data: data}}, Options{})
		if err == nil {
			if _, err := cfg.Dump(); err != nil {
				t.Fatal(err)
			}
			for _, d := range cfg.Tree.Domains() {
				for _, l := range cfg.Tree.Leaves(d.Name) {
					var es []string
					for _, p := range l.Path {
						es = append(es, p.Key, p.Value+"x")
					}
					cfg.Tree.Match(d.Name, e(es...))
				}
			}
		}
	})
}

func TestLoadFixedWindowDefault(t *testing.T) {
	text := `domain: api
descriptors:
  - key: plain
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: sliding
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: sliding_window}
  - key: fixed
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: fixed_window}
`
	for _, fixedDefault := range []bool{false, true} {
		cfg, _, err := load(t, Options{FixedWindowDefault: fixedDefault}, "api.yaml", text)
		if err != nil {
			t.Fatal(err)
		}
		// Only a rate_limit without an algorithm follows the default.
		plain := tiers.KindTiers
		if fixedDefault {
			plain = tiers.KindFixedWindow
		}
		for key, want := range map[string]tiers.Kind{"plain": plain, "sliding": tiers.KindTiers, "fixed": tiers.KindFixedWindow} {
			m, ok := cfg.Tree.Match("api", []descriptors.Entry{{Key: key, Value: "x"}})
			if !ok || m.Policy == nil {
				t.Fatalf("%s: no match", key)
			}
			if m.Policy.Kind != want {
				t.Errorf("FixedWindowDefault %v, %s: got kind %v, want %v", fixedDefault, key, m.Policy.Kind, want)
			}
			if want == tiers.KindFixedWindow && (m.Policy.Window.Limit != 10 || m.Policy.Window.Unit != tiers.UnitHour) {
				t.Errorf("fixed window %+v, want 10 per hour", m.Policy.Window)
			}
		}
	}
}

func TestProblems(t *testing.T) {
	fsys := fstest.MapFS{
		"a.yaml": {Data: []byte("domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")},
		"b.yaml": {Data: []byte("domain: b\ndescriptors:\n  - key: k\n    tiers: [{limit: 0, window: 1s}]\n")},
	}
	_, _, err := Load(fsys, Options{})
	if got := Problems(err); len(got) != 2 || !strings.Contains(got[0].Error(), "a.yaml:") || !strings.Contains(got[1].Error(), "b.yaml:") {
		t.Errorf("Problems = %v, want one per file, a.yaml then b.yaml", got)
	}
	if got := Problems(nil); got != nil {
		t.Errorf("Problems(nil) = %v", got)
	}
	if got := Problems(errors.New("x")); len(got) != 1 {
		t.Errorf("Problems(one error) = %v", got)
	}
}

func TestMetadata(t *testing.T) {
	cfg, _, err := Load(fstest.MapFS{"a.yaml": {Data: []byte(`domain: d
descriptors:
  - key: k
    metadata:
      team: payments
      nested: {tier: 2, tags: [a, b]}
    rate_limit: {unit: second, requests_per_unit: 5}
`)}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := cfg.Tree.Match("d", []descriptors.Entry{{Key: "k", Value: "x"}})
	if m.Limit == nil || m.Limit.Metadata["team"] != "payments" {
		t.Fatalf("metadata: %+v", m.Limit)
	}
	// envoyproxy/ratelimit's yaml.v2 keeps a date as its text.
	cfg, _, err = Load(fstest.MapFS{"a.yaml": {Data: []byte("domain: d\ndescriptors:\n  - key: k\n    metadata: {when: 2020-01-02}\n    rate_limit: {unit: second, requests_per_unit: 5}\n")}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	m, _ = cfg.Tree.Match("d", []descriptors.Entry{{Key: "k", Value: "x"}})
	if got := m.Limit.Metadata["when"]; got != "2020-01-02" {
		t.Errorf("a date in metadata: got %#v, want the text 2020-01-02", got)
	}
}

// bigFS is 1,000 files of 100 descriptors each, in the three shapes users
// write: rate_limit in flow style, tier lists, nested token buckets.
func bigFS() fstest.MapFS {
	fsys := fstest.MapFS{}
	for f := 0; f < 1000; f++ {
		var b strings.Builder
		fmt.Fprintf(&b, "domain: d%d\ndescriptors:\n", f)
		for d := 0; d < 100; d++ {
			switch d % 3 {
			case 0:
				fmt.Fprintf(&b, "  - key: k%d\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", d, d+1)
			case 1:
				fmt.Fprintf(&b, "  - key: k%d\n    value: v%d\n    tiers:\n      - {limit: 5, window: 1s}\n      - {limit: 20, window: 1s, active: 5s, cooldown: 15s}\n", d, d)
			default:
				fmt.Fprintf(&b, "  - key: k%d\n    descriptors:\n      - key: user\n        token_bucket: {capacity: 100, refill: 1, per: 1s}\n", d)
			}
		}
		fsys[fmt.Sprintf("f%04d.yaml", f)] = &fstest.MapFile{Data: []byte(b.String())}
	}
	return fsys
}

// BenchmarkLoad1000Files loads bigFS from a directory on disk, as charon
// serve and charon config check do. The target is at most 5 s per load; the
// benchmark reports the figure and asserts nothing about time, as the
// machine may be shared.
func BenchmarkLoad1000Files(b *testing.B) {
	dir := b.TempDir()
	for name, f := range bigFS() {
		if err := os.WriteFile(filepath.Join(dir, name), f.Data, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	fsys := os.DirFS(dir)
	cfg, _, err := Load(fsys, Options{})
	if err != nil {
		b.Fatal(err)
	}
	if got := len(cfg.Tree.Domains()); got != 1000 {
		b.Fatalf("loaded %d domains, want 1000", got)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := Load(fsys, Options{}); err != nil {
			b.Fatal(err)
		}
	}
}

func TestLoadOverdraft(t *testing.T) {
	text := `domain: api
descriptors:
  - key: plain
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: postpaid
    rate_limit: {unit: hour, requests_per_unit: 10}
    overdraft: true
  - key: admission
    token_bucket: {capacity: 5, refill: 1, per: 1s}
    overdraft: false
  - key: user
    tiers: [{limit: 5, window: 1s}]
    overdraft: true
    overrides:
      - domain: vip
        tiers: [{limit: 50, window: 1s}]
`
	for _, def := range []bool{false, true} {
		cfg, _, err := load(t, Options{OverdraftDefault: def}, "api.yaml", text)
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			key, value string
			want       bool
		}{{"plain", "x", def}, {"postpaid", "x", true}, {"admission", "x", false}, {"user", "alice", true}, {"user", "vip", true}} {
			m, ok := cfg.Tree.Match("api", []descriptors.Entry{{Key: tc.key, Value: tc.value}})
			if !ok || m.Policy == nil {
				t.Fatalf("%s=%s: no match", tc.key, tc.value)
			}
			if m.Policy.Overdraft != tc.want {
				t.Errorf("OverdraftDefault %v, %s=%s: got Overdraft %v, want %v", def, tc.key, tc.value, m.Policy.Overdraft, tc.want)
			}
		}
	}
	// A post-paid limit is another policy set (its ID) of the same shape:
	// its state, the count, is kept (SPEC §3).
	a, _, _ := load(t, Options{}, "api.yaml", text)
	b, _, _ := load(t, Options{OverdraftDefault: true}, "api.yaml", text)
	ma, _ := a.Tree.Match("api", []descriptors.Entry{{Key: "plain", Value: "x"}})
	mb, _ := b.Tree.Match("api", []descriptors.Entry{{Key: "plain", Value: "x"}})
	if ma.Limit.ID == mb.Limit.ID {
		t.Errorf("the same policy ID %x with and without post-paid counting", ma.Limit.ID)
	}
	if ma.Shape != mb.Shape || ma.Shape == 0 {
		t.Errorf("shapes %x and %x with and without post-paid counting, want one", ma.Shape, mb.Shape)
	}

	for _, tc := range []struct{ name, text, want string }{
		{"not a boolean", "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n    overdraft: often\n", "api.yaml:5: descriptors[0].overdraft:"},
		{"no policy", "domain: api\ndescriptors:\n  - key: a\n    overdraft: true\n", "api.yaml:4: descriptors[0].overdraft: needs a policy"},
		{"unlimited", "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true}\n    overdraft: true\n", "api.yaml:5: descriptors[0].overdraft: applies only to"},
		{"copies", "domain: api\ndescriptors:\n  - key: a\n    copies: {domain_limit: 2}\n    overdraft: true\n", "api.yaml:5: descriptors[0].overdraft: applies only to"},
	} {
		_, _, err := load(t, Options{}, "api.yaml", tc.text)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got error %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}

// TestLoadGenerated: files written by a program name their rules by file
// alone; files of people by file and line.
func TestLoadGenerated(t *testing.T) {
	text := "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 5}\n"
	for _, tc := range []struct {
		generated bool
		want      string
	}{{false, "res:3"}, {true, "res"}} {
		cfg, _, err := load(t, Options{Generated: tc.generated}, "res", text)
		if err != nil {
			t.Fatal(err)
		}
		m, _ := cfg.Tree.Match("api", []descriptors.Entry{{Key: "user", Value: "x"}})
		if got := m.Limit.Where(); got != tc.want {
			t.Errorf("Generated %v: Where %q, want %q", tc.generated, got, tc.want)
		}
	}
}
