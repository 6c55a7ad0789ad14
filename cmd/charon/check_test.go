package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/charonlimit/charon/config"
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
		{[]string{"config", "check", "../../examples/config"}, 0, "OK", ""},
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

// TestConfigCheckLoadsAsServe: config check reads the environment serve
// reads to load a configuration (CHARON_FIXED_WINDOW, CHARON_MERGE_DOMAINS,
// MERGE_DOMAIN_CONFIG), its flags override it as serve's do, and its
// verdict is the one serve's configuration loads with.
func TestConfigCheckLoadsAsServe(t *testing.T) {
	// A hard_limit is refused on a fixed-window rate_limit.
	hard := t.TempDir()
	if err := os.WriteFile(filepath.Join(hard, "a.yaml"), []byte("domain: a\ndescriptors:\n  - key: k\n"+
		"    rate_limit: {unit: second, requests_per_unit: 10}\n    hard_limit: 5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Two files of one domain load only merged.
	merge := t.TempDir()
	for name, key := range map[string]string{"x.yaml": "a", "y.yaml": "b"} {
		if err := os.WriteFile(filepath.Join(merge, name), []byte("domain: m\ndescriptors:\n  - key: "+key+
			"\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	const hardErr = "a.yaml:5: descriptors[0].hard_limit: applies only to tiers and to a sliding-window rate_limit"
	tests := []struct {
		name   string
		dir    string
		flags  []string
		env    map[string]string
		code   int
		stderr string
	}{
		{"sliding by default", hard, nil, nil, 0, "OK"},
		{"CHARON_FIXED_WINDOW", hard, nil, map[string]string{"CHARON_FIXED_WINDOW": "true"}, 1, hardErr},
		{"--fixed-window", hard, []string{"--fixed-window"}, nil, 1, hardErr},
		{"flag beats CHARON_FIXED_WINDOW", hard, []string{"--fixed-window=false"}, map[string]string{"CHARON_FIXED_WINDOW": "true"}, 0, "OK"},
		{"domains apart by default", merge, nil, nil, 1, "duplicate domain"},
		{"MERGE_DOMAIN_CONFIG", merge, nil, map[string]string{"MERGE_DOMAIN_CONFIG": "true"}, 0, "OK"},
		{"CHARON_MERGE_DOMAINS", merge, nil, map[string]string{"CHARON_MERGE_DOMAINS": "1"}, 0, "OK"},
		{"CHARON_MERGE_DOMAINS beats MERGE_DOMAIN_CONFIG", merge, nil,
			map[string]string{"MERGE_DOMAIN_CONFIG": "true", "CHARON_MERGE_DOMAINS": "false"}, 1, "duplicate domain"},
		{"--merge-domains", merge, []string{"--merge-domains"}, nil, 0, "OK"},
		{"flag beats MERGE_DOMAIN_CONFIG", merge, []string{"--merge-domains=false"}, map[string]string{"MERGE_DOMAIN_CONFIG": "true"}, 1, "duplicate domain"},
		{"bad MERGE_DOMAIN_CONFIG", merge, nil, map[string]string{"MERGE_DOMAIN_CONFIG": "perhaps"}, 2, "MERGE_DOMAIN_CONFIG"},
		{"bad CHARON_FIXED_WINDOW", hard, nil, map[string]string{"CHARON_FIXED_WINDOW": "perhaps"}, 2, "CHARON_FIXED_WINDOW"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			args := append([]string{"config", "check", tc.dir}, tc.flags...)
			code := run(args, envOf(tc.env), &out, &errb)
			// The verdict OK on stdout, errors on stderr.
			if code != tc.code || !strings.Contains(out.String()+errb.String(), tc.stderr) || (code == 0) != strings.Contains(out.String(), "OK") {
				t.Errorf("charon %v with %v: got exit %d, stdout %q, stderr %q; want exit %d, output with %q",
					args, tc.env, code, out.String(), errb.String(), tc.code, tc.stderr)
			}
			c, err := parseServe(append([]string{"--config", tc.dir}, tc.flags...), envOf(tc.env), io.Discard)
			if err != nil {
				if code != 2 {
					t.Errorf("serve refuses the settings (%v), config check exits %d", err, code)
				}
				return
			}
			_, _, err = config.Load(config.DirFS(tc.dir), c.Load)
			if (err == nil) != (code == 0) {
				t.Errorf("serve loads with error %v, config check exits %d", err, code)
			}
		})
	}
}

// TestMainLyftCommand: envoyproxy/ratelimit's deployments run its image's
// /bin/ratelimit with no arguments (the image links it to charon), or give
// it as the command beside the image's entrypoint (Compose): both serve.
func TestMainLyftCommand(t *testing.T) {
	for _, tc := range []struct{ argv, want []string }{
		{[]string{"/bin/ratelimit"}, []string{"serve"}},
		{[]string{"ratelimit", "--config", "/c"}, []string{"serve", "--config", "/c"}},
		{[]string{"/usr/local/bin/charon", "/bin/ratelimit"}, []string{"serve"}},
		{[]string{"/usr/local/bin/charon", "serve", "--config", "/c"}, []string{"serve", "--config", "/c"}},
		{[]string{"/usr/local/bin/charon", "version"}, []string{"version"}},
		{[]string{"charon"}, []string{}},
		{[]string{"/bin/ratelimit-tool", "version"}, []string{"version"}},
	} {
		if got := commandArgs(tc.argv); !slices.Equal(got, tc.want) {
			t.Errorf("argv %q: args %q, want %q", tc.argv, got, tc.want)
		}
	}

	// Started as /bin/ratelimit with Istio's sample environment (its Redis
	// left out) over an image default that does not exist: serve loads the
	// RUNTIME_* directory, here missing, and stops saying so.
	setDefaultConfigDir(t, filepath.Join(t.TempDir(), "image-config"))
	root := t.TempDir()
	env := map[string]string{}
	for k, v := range istioSampleEnv {
		if !strings.HasPrefix(k, "REDIS_") {
			env[k] = v
		}
	}
	env["RUNTIME_ROOT"] = root
	var out, errb bytes.Buffer
	code := run(commandArgs([]string{"/bin/ratelimit"}), envOf(env), &out, &errb)
	want := filepath.Join(root, "ratelimit", "config")
	if code != 1 || !strings.Contains(errb.String(), "cannot start") || !strings.Contains(errb.String(), want) {
		t.Errorf("/bin/ratelimit: exit %d, stderr %q; want exit 1, serve's \"cannot start\" naming %s", code, errb.String(), want)
	}
}
