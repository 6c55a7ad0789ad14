package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/google/go-cmp/cmp"
	"gopkg.in/yaml.v3"
)

// yamlV3 parses data the way the loader does without the fast path.
func yamlV3(data []byte) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		return nil, err
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("second document: %v", err)
	}
	return &doc, nil
}

// diffNodes describes the first difference between two trees in the fields
// the loader reads, "" when they agree.
func diffNodes(path string, got, want *yaml.Node) string {
	if (got == nil) != (want == nil) {
		return fmt.Sprintf("%s: node %v, want %v", path, got != nil, want != nil)
	}
	if got == nil {
		return ""
	}
	type fields struct {
		Kind         yaml.Kind
		Style        yaml.Style
		Tag, Value   string
		Anchor       string
		Alias        bool
		Line, Column int
		Content      int
	}
	fg := fields{got.Kind, got.Style, got.Tag, got.Value, got.Anchor, got.Alias != nil, got.Line, got.Column, len(got.Content)}
	fw := fields{want.Kind, want.Style, want.Tag, want.Value, want.Anchor, want.Alias != nil, want.Line, want.Column, len(want.Content)}
	if got.Kind == yaml.DocumentNode {
		// The loader reads only a document's content.
		fg.Line, fg.Column, fw.Line, fw.Column = 0, 0, 0, 0
	}
	if fg != fw {
		return fmt.Sprintf("%s: got %+v, want %+v", path, fg, fw)
	}
	for i := range got.Content {
		if d := diffNodes(fmt.Sprintf("%s/%d", path, i), got.Content[i], want.Content[i]); d != "" {
			return d
		}
	}
	return ""
}

// checkFast fails when the fast parser accepts data but builds another tree
// than yaml.v3, or accepts what yaml.v3 refuses. It reports whether the fast
// parser accepted data.
func checkFast(t *testing.T, data []byte) bool {
	t.Helper()
	got, ok := fastParse(data)
	if !ok {
		return false
	}
	want, err := yamlV3(data)
	if err != nil {
		t.Fatalf("fast parser accepts what yaml.v3 refuses (%v):\n%s", err, data)
	}
	if d := diffNodes("doc", got, want); d != "" {
		t.Fatalf("%s\ninput:\n%s", d, data)
	}
	return true
}

// fastSeeds are the differential test's inputs: the loader's test files,
// the envoyproxy/ratelimit corpus, a file of the load benchmark, and texts at
// the edges of the subset.
func fastSeeds(t testing.TB) [][]byte {
	var seeds [][]byte
	var globs []string
	for _, sub := range []string{"valid", "examples", "invalid"} {
		globs = append(globs, filepath.Join(lyftDir, sub, "*.yaml"))
	}
	globs = append(globs, filepath.Join("testdata", "*", "*.yaml"), filepath.Join("..", "examples", "config", "*.yaml"))
	for _, g := range globs {
		m, _ := filepath.Glob(g)
		for _, p := range m {
			data, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			seeds = append(seeds, data)
		}
	}
	seeds = append(seeds, bigFS()["f0000.yaml"].Data)
	for _, s := range []string{
		"domain: a\ndescriptors:\n- key: k\n  value: v\n- key: k2\nother: 1\n",
		"domain: a\ndescriptors:\n  - key: k\n    descriptors:\n    - key: x # c\n      value: 'it''s'\n",
		"a: [1, '2', \"3\", {b: c, d: [e, f]}, [], {}]\n",
		"a: {x: 1, y: -2, z: 0x1F, w: 1_000, v: 012, u: .5, t: 2001-12-14, s: ~, r: null, q: True, p: yes}\n",
		"a:\n  -\n    b: c\n  - - d\n",
		"-  a: 1\n   b: 2\n- c\n",
		"a: b: c\n", "a: 'b\n  c'\n", "a: b\n  c\n", "a: [b,\n  c]\n", "a: \"b\\n\"\n", "a: &x b\nc: *x\n",
		"a: !!str 1\n", "a: |\n  b\n", "a:\n", "a: [b, ]\n", "{a: b}\n", "a: <<\n", "<<: {b: c}\n",
		"a:b\n", "a : b\n", "a: b #c\n", "a: b#c\n", "'a': b\n", "\"a\": b\n", "a: 'b'c\n", "a: [a:b]\n",
		"  a: 1\n  b: 2\n", "a:\n    b: 1\n  c: 2\n", "a: 1\n- b\n", "0.25: x\n", "a: -\n", "a: - b\n",
		"a: [b] c\n", "a: {b}\n", "a: {b: }\n", "a: [,]\n", "---\na: 1\n", "a: 1\n...\n", "%YAML 1.2\n---\na: 1\n",
		"a:\n  # comment\n  b: 1\n# end\n", "a: 1 \nb: 2   # x\n", "# only a comment\n", "", "\n\n",
		"a: [-, a]\n", "a: [-]\n", "- -1\n", "a: -x\n", "a: {'a': 1}\n", "- 'a': 1\n", "- a:\n  - x\n- b: 1\n",
		"a: b[c]\n", "a: x,y\n", "-a: 1\n", "~: 1\n", "a: \"\"\n", "a: ''\n", "a: [\"\", '']\n", "--- # c\na: 1\n",
		"a:\n  - b: 1\n    c: [1]\n  -\n    d: 2\n", "a: b  c  \n", "a: 1.5e3\n", "a: 0o17\n", "a: .inf\n", "a: +1\n",
		"a: 2001-12-14t21:59:43.10-05:00\n", "a: 1:2\n", "a: [a b, c d]\n", "a: { b: c }\n", "a: [ ]\n", "a: [[], [[]]]\n",
		"'a b': c\n", "a: 'x' \n", "---\n---\na: 1\n", "a: [b]#c\n", "a: 'b'#c\n", "a:  # c\n  b: 1\n",
		"a: x:y\n", "a: x :y\n", "a: '#'\n", "a: \"#\"\n", "a: [x, y]   \n", "a: {x: [1, 2]}#c\n",
	} {
		seeds = append(seeds, []byte(s))
	}
	return seeds
}

// TestFastYAMLSeeds checks the fast parser against yaml.v3 on every seed,
// and that it takes the files the loader's users write.
func TestFastYAMLSeeds(t *testing.T) {
	accepted := 0
	for _, s := range fastSeeds(t) {
		if checkFast(t, s) {
			accepted++
		}
	}
	if accepted < 20 {
		t.Errorf("the fast parser accepted only %d seeds", accepted)
	}
	for _, f := range []string{"valid", "examples"} {
		m, _ := filepath.Glob(filepath.Join(lyftDir, f, "*.yaml"))
		for _, p := range m {
			data, _ := os.ReadFile(p)
			if _, ok := fastParse(data); !ok {
				t.Errorf("%s: not taken by the fast parser", p)
			}
		}
	}
	if _, ok := fastParse(bigFS()["f0000.yaml"].Data); !ok {
		t.Error("the benchmark's files are not taken by the fast parser")
	}
}

// FuzzFastYAML: for every input the fast parser accepts, its tree is the
// tree of yaml.v3.
func FuzzFastYAML(f *testing.F) {
	for _, s := range fastSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkFast(t, data)
	})
}

func TestFastYAMLErrorsKeepLines(t *testing.T) {
	// A file outside the subset goes through yaml.v3 whole: its errors keep
	// their lines.
	text := "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: &x k2\n    bogus: 1\n"
	_, _, err := load(t, Options{}, "a.yaml", text)
	if err == nil || !strings.Contains(err.Error(), `a.yaml:6: descriptors[1].bogus: unknown key "bogus"`) {
		t.Fatalf("err = %v", err)
	}
}

// TestFastYAMLLoadsAlike loads every seed with and without the fast parser:
// the errors, warnings and dumped trees are the same.
func TestFastYAMLLoadsAlike(t *testing.T) {
	loadText := func(data []byte, v3 bool) string {
		yamlV3Only = v3
		defer func() { yamlV3Only = false }()
		cfg, warns, err := Load(fstest.MapFS{"f.yaml": {Data: data}}, Options{})
		var b strings.Builder
		fmt.Fprintf(&b, "error: %v\n", err)
		for _, w := range warns {
			fmt.Fprintf(&b, "warning: %s\n", w)
		}
		if cfg != nil {
			out, err := cfg.Dump()
			fmt.Fprintf(&b, "dump (%v):\n%s", err, out)
		}
		return b.String()
	}
	for _, s := range fastSeeds(t) {
		if diff := cmp.Diff(loadText(s, true), loadText(s, false)); diff != "" {
			t.Errorf("input:\n%s\nyaml.v3 (-) and fast parser (+):\n%s", s, diff)
		}
	}
}

func TestMergeDuplicatePath(t *testing.T) {
	_, _, err := load(t, Options{MergeDomains: true},
		"a.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
		"b.yaml", "domain: d\ndescriptors:\n  - key: x\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 2}\n")
	want := `b.yaml:4: descriptors[1]: duplicate descriptor: key "k" value "" already at a.yaml:3`
	if err == nil || err.Error() != want {
		t.Fatalf("err = %v, want %s", err, want)
	}
}
