package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestConfigCheck(t *testing.T) {
	bad := t.TempDir()
	if err := os.WriteFile(filepath.Join(bad, "x.yaml"), []byte("domain: x\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{[]string{"config", "check", "../../examples/config"}, 0, "", "OK"},
		{[]string{"config", "check", "../../examples/config", "--dump"}, 0, "domain: bench", "OK"},
		{[]string{"config", "check", "--dump", "../../examples/config"}, 0, "domain: api", "OK"},
		{[]string{"config", "check", bad}, 1, "", "x.yaml:"},
		{[]string{"config", "check"}, 2, "", "one directory"},
		{[]string{"config", "check", filepath.Join(bad, "missing")}, 1, "", "not a readable directory"},
		{[]string{"config"}, 2, "", "usage"},
		{[]string{"nope"}, 2, "", "unknown verb"},
		{[]string{"version"}, 0, "charon ", ""},
		{[]string{"serve", "--store", "redis"}, 2, "", "needs --redis-url"},
	}
	for _, tc := range tests {
		var out, errb bytes.Buffer
		code := run(tc.args, func(string) string { return "" }, &out, &errb)
		if code != tc.code || !strings.Contains(out.String(), tc.stdout) || !strings.Contains(errb.String(), tc.stderr) {
			t.Errorf("charon %v: exit %d, stdout %q, stderr %q; want exit %d, stdout with %q, stderr with %q",
				tc.args, code, out.String(), errb.String(), tc.code, tc.stdout, tc.stderr)
		}
	}
}
