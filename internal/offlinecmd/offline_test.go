package offlinecmd

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/internal/clientcmd"
)

// fixed is a LoadFlags whose environment says o (an error when err is
// set).
func fixed(o config.Options, err error) LoadFlags {
	return func(fs *flag.FlagSet, _ io.Writer) (*config.Options, error) {
		if err != nil {
			return nil, err
		}
		o.Bind(fs)
		return &o, nil
	}
}

// TestCheckLoadsWithLoadFlags: config check loads with what LoadFlags
// gives, its flags override it, and an environment LoadFlags refuses is a
// usage error (exit 2) before any directory is read.
func TestCheckLoadsWithLoadFlags(t *testing.T) {
	dir := t.TempDir()
	for name, key := range map[string]string{"x.yaml": "a", "y.yaml": "b"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("domain: m\ndescriptors:\n  - key: "+key+"\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name string
		load LoadFlags
		args []string
		code int
		out  string
	}{
		{"apart", fixed(config.Options{}, nil), nil, 1, "duplicate domain"},
		{"merged by the environment", fixed(config.Options{MergeDomains: true}, nil), nil, 0, "OK"},
		{"the flag over the environment", fixed(config.Options{MergeDomains: true}, nil), []string{"--merge-domains=false"}, 1, "duplicate domain"},
		{"an environment refused", fixed(config.Options{}, fmt.Errorf("%w: MERGE_DOMAIN_CONFIG=%q: bad", clientcmd.ErrUsage, "perhaps")), nil, 2, "MERGE_DOMAIN_CONFIG"},
	} {
		var out, errb bytes.Buffer
		code := Config(append([]string{"check", dir}, tc.args...), tc.load, &out, &errb)
		if code != tc.code || !strings.Contains(out.String()+errb.String(), tc.out) {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit %d with %q", tc.name, code, out.String(), errb.String(), tc.code, tc.out)
		}
	}
	var errb bytes.Buffer
	if code := Config([]string{"lint"}, fixed(config.Options{}, nil), io.Discard, &errb); code != 2 || !strings.Contains(errb.String(), "usage: charon config check") {
		t.Errorf("config lint: exit %d, %q; want 2 and the usage", code, errb.String())
	}
	if !errors.Is(Diff([]string{dir}, fixed(config.Options{}, nil), io.Discard, io.Discard), clientcmd.ErrUsage) {
		t.Error("config diff of one directory: not a usage error")
	}
}
