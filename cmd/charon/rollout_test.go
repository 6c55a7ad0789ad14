package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/charonlimit/charon/config"
)

// writeConfig writes a configuration directory of name -> text files.
func writeConfig(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestConfigDiff(t *testing.T) {
	a := writeConfig(t, map[string]string{"api.yaml": "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 10}\n"})
	b := writeConfig(t, map[string]string{"api.yaml": "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 5}\n"})
	bad := writeConfig(t, map[string]string{"x.yaml": "domain: x\nbogus: 1\n"})
	tests := []struct {
		args   []string
		code   int
		stdout string
		stderr string
	}{
		// As diff(1): 1 when they differ, 0 when not, 2 on trouble.
		{[]string{"config", "diff", a, b}, 1, "limit: 10 per 1s -> 5 per 1s", ""},
		{[]string{"config", "diff", a, a}, 0, "no difference", ""},
		{[]string{"config", "diff", "--json", a, b}, 1, `"field": "limit"`, ""},
		{[]string{"config", "diff", "--json", a, a}, 0, `{`, ""},
		{[]string{"config", "diff", a}, 2, "", "two directories"},
		{[]string{"config", "diff", a, bad}, 2, "", "x.yaml:"},
		{[]string{"config", "diff", a, "/nonexistent"}, 2, "", "/nonexistent is not a readable directory: no such file or directory"},
		{[]string{"config", "diff", a, filepath.Join(a, "api.yaml")}, 2, "", "api.yaml is not a readable directory but a file: give the directory"},
		{[]string{"config", "diff", "-h"}, 0, "", "usage: charon config diff"},
	}
	for _, tc := range tests {
		var out, errb bytes.Buffer
		code := run(tc.args, func(string) string { return "" }, &out, &errb)
		if code != tc.code || !strings.Contains(out.String(), tc.stdout) || !strings.Contains(errb.String(), tc.stderr) {
			t.Errorf("charon %v: exit %d, stdout %q, stderr %q; want exit %d, stdout with %q, stderr with %q",
				tc.args, code, out.String(), errb.String(), tc.code, tc.stdout, tc.stderr)
		}
	}
	var out bytes.Buffer
	run([]string{"config", "diff", "--json", b, a}, func(string) string { return "" }, &out, &bytes.Buffer{})
	var d config.Diff
	if err := json.Unmarshal(out.Bytes(), &d); err != nil || len(d.Rules) != 1 || d.Rules[0].Changes[0].Old != "5 per 1s" {
		t.Errorf("--json of b a: %v %+v", err, d)
	}
}
