package clientcmd

import (
	"bytes"
	"strings"
	"testing"

	"github.com/charonlimit/charon/internal/servertest"
)

// TestUsage: usage prints each matched limit's use and renewal without
// counting (two asks, then two usage calls, leave 8 of the quota's 10), a
// rate limit's as "rate", and nothing for a descriptor no limit matches;
// --json prints the UsageResponse.
func TestUsage(t *testing.T) {
	addr, _ := servertest.CopyServer(t)
	for range 2 {
		if code := run([]string{"ask", "--addr", addr, "--domain", "c", "--descriptor", "plan=acme"}, nil, &bytes.Buffer{}, &bytes.Buffer{}); code != 0 {
			t.Fatalf("ask: exit %d", code)
		}
	}
	for _, tc := range []struct {
		args []string
		has  []string
	}{
		{[]string{"--descriptor", "plan=acme"}, []string{"plan=acme quota year 2 10 8 "}},
		{[]string{"--descriptor", "plan=acme"}, []string{"plan=acme quota year 2 10 8 "}},
		{[]string{"--descriptor", "banned=x"}, []string{"banned=x rate fixed window, minute 0 0 0 - -"}},
		{[]string{"--descriptor", "other=x"}, []string{"no limit applies"}},
		{[]string{"--descriptor", "plan=acme", "--json"}, []string{`"kind":"quota"`, `"used":"2"`, `"remaining":"8"`, `"renews":"`}},
	} {
		var out, errb bytes.Buffer
		args := append([]string{"usage", "--addr", addr, "--domain", "c"}, tc.args...)
		if code := run(args, nil, &out, &errb); code != 0 {
			t.Errorf("%v: exit %d (stderr %q)", tc.args, code, errb.String())
		}
		// Columns are aligned with spaces, protojson varies its own: compare
		// with one space between words, and with none.
		text := out.String()
		spaced, dense := strings.Join(strings.Fields(text), " "), strings.Join(strings.Fields(text), "")
		for _, s := range tc.has {
			if !strings.Contains(spaced, s) && !strings.Contains(dense, s) {
				t.Errorf("%v: output lacks %q:\n%s", tc.args, s, text)
			}
		}
	}
	var errb bytes.Buffer
	if code := run([]string{"usage", "--addr", addr, "--domain", "c"}, nil, &bytes.Buffer{}, &errb); code != 2 {
		t.Errorf("usage without --descriptor: exit %d, want 2 (stderr %q)", code, errb.String())
	}
}
