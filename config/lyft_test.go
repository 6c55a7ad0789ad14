package config

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"testing/fstest"
)

// lyftDir is envoyproxy/ratelimit's config corpus, vendored with its license
// (see its README.md).
var lyftDir = filepath.Join("testdata", "lyft")

func lyftFiles(t *testing.T, sub string) []string {
	t.Helper()
	dir := filepath.Join(lyftDir, sub)
	m, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(m) == 0 {
		t.Fatalf("no files in %s: %v", dir, err)
	}
	return m
}

func mapFS(t *testing.T, paths ...string) fstest.MapFS {
	t.Helper()
	fsys := fstest.MapFS{}
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		fsys[filepath.Base(p)] = &fstest.MapFile{Data: data}
	}
	return fsys
}

func TestLyftValidAndExamples(t *testing.T) {
	for _, sub := range []string{"valid", "examples"} {
		for _, f := range lyftFiles(t, sub) {
			t.Run(sub+"/"+filepath.Base(f), func(t *testing.T) {
				cfg, warns, err := Load(mapFS(t, f), Options{})
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				for _, w := range warns {
					t.Logf("warning: %s", w)
				}
				if len(cfg.Tree.Domains()) != 1 {
					t.Errorf("%d domains, want 1", len(cfg.Tree.Domains()))
				}
			})
		}
	}
}

func TestLyftMergeDomains(t *testing.T) {
	files := lyftFiles(t, "valid")
	var pair []string
	for _, f := range files {
		if strings.Contains(f, "merge_domain_key") {
			pair = append(pair, f)
		}
	}
	if len(pair) != 2 {
		t.Fatalf("merge_domain_key files: %v", pair)
	}
	_, _, err := Load(mapFS(t, pair...), Options{})
	if err == nil || !strings.Contains(err.Error(), "duplicate domain") {
		t.Fatalf("without merging: err = %v, want duplicate domain", err)
	}
	cfg, _, err := Load(mapFS(t, pair...), Options{MergeDomains: true})
	if err != nil {
		t.Fatalf("with merging: %v", err)
	}
	for _, d := range [][]string{{"key1", "value1"}, {"key2", "value2"}} {
		if _, ok := cfg.Tree.Match("test-domain", e(d...)); !ok {
			t.Errorf("merged tree does not match %v", d)
		}
	}
}

func TestLyftInvalid(t *testing.T) {
	want := map[string]*regexp.Regexp{
		"empty_domain.yaml":        regexp.MustCompile(`^empty_domain.yaml:1: domain: empty domain`),
		"duplicate_domain.yaml":    regexp.MustCompile(`^duplicate_domain.yaml:1: domain: duplicate domain "test-domain"`),
		"empty_key.yaml":           regexp.MustCompile(`^empty_key.yaml:3: descriptors\[0\]\.key: descriptor has an empty key`),
		"duplicate_key.yaml":       regexp.MustCompile(`^duplicate_key.yaml:6: descriptors\[1\]: duplicate descriptor: key "key1" value "value1" already at line 3`),
		"bad_limit_unit.yaml":      regexp.MustCompile(`^bad_limit_unit.yaml:6: descriptors\[0\]\.rate_limit\.unit: invalid rate limit unit "foo"`),
		"replaces_self.yaml":       regexp.MustCompile(`^replaces_self.yaml:10: descriptors\[0\]\.descriptors\[0\]\.rate_limit\.replaces\[0\]\.name: a limit cannot replace its own name "self"`),
		"replaces_empty.yaml":      regexp.MustCompile(`^replaces_empty.yaml:10: descriptors\[0\]\.descriptors\[0\]\.rate_limit\.replaces\[0\]\.name: empty replaces entry`),
		"bad_yaml.yaml":            regexp.MustCompile(`^bad_yaml.yaml:\d+: invalid YAML: `),
		"misspelled_key.yaml":      regexp.MustCompile(`^misspelled_key.yaml:5: descriptors\[0\]\.ratelimit: unknown key "ratelimit"`),
		"misspelled_key2.yaml":     regexp.MustCompile(`^misspelled_key2.yaml:7: descriptors\[0\]\.rate_limit\.requestsperunit: unknown key "requestsperunit"`),
		"non_string_key.yaml":      regexp.MustCompile(`^non_string_key.yaml:1: key "0.25" is not a string`),
		"non_map_list.yaml":        regexp.MustCompile(`^non_map_list.yaml:3: descriptors\[0\]: must be a mapping, not "a"`),
		"unlimited_with_unit.yaml": regexp.MustCompile(`^unlimited_with_unit.yaml:6: descriptors\[0\]\.rate_limit\.unit: unit given with unlimited: true`),
	}
	files := lyftFiles(t, "invalid")
	if len(files) != len(want) {
		t.Errorf("%d invalid files, the table knows %d", len(files), len(want))
	}
	var basic string
	for _, f := range lyftFiles(t, "valid") {
		if filepath.Base(f) == "basic_config.yaml" {
			basic = f
		}
	}
	for _, f := range files {
		name := filepath.Base(f)
		t.Run(name, func(t *testing.T) {
			re := want[name]
			if re == nil {
				t.Fatalf("no expectation for %s", name)
			}
			load := []string{f}
			if name == "duplicate_domain.yaml" {
				load = append(load, basic) // basic_config.yaml sorts first
			}
			_, _, err := Load(mapFS(t, load...), Options{})
			if err == nil {
				t.Fatal("loaded, want refused")
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error does not match ErrInvalid: %v", err)
			}
			found := false
			for _, line := range strings.Split(err.Error(), "\n") {
				found = found || re.MatchString(line)
			}
			if !found {
				t.Errorf("error:\n%v\nwant a line matching %s", err, re)
			}
		})
	}
}
