package clientcmd

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/charonlimit/charon/internal/servertest"
)

// TestAsk: ask exits 0 on any answer, and with --exit-code 3 on
// OVER_LIMIT; --json leaves out the fields at their zero value, as /json
// does; the reset is printed rounded to the millisecond.
func TestAsk(t *testing.T) {
	addr, _ := servertest.CopyServer(t)
	for _, tc := range []struct {
		args     []string
		code     int
		has, not []string
	}{
		{[]string{"--descriptor", "banned=x"}, 0, []string{"OVER_LIMIT  domain c", "0 per minute", "remaining 0", "reset in "}, nil},
		{[]string{"--descriptor", "banned=x", "--exit-code"}, 3, []string{"OVER_LIMIT"}, nil},
		{[]string{"--descriptor", "db=a", "--exit-code"}, 0, []string{"OK  domain c"}, nil},
		{[]string{"--descriptor", "banned=x", "--json"}, 0, []string{`"overallCode":"OVER_LIMIT"`, `"unit":"MINUTE"`},
			[]string{`"limitRemaining"`, `"requestsPerUnit"`, `"responseHeadersToAdd"`, `"rawBody"`}},
	} {
		var out, errb bytes.Buffer
		args := append([]string{"ask", "--addr", addr, "--domain", "c"}, tc.args...)
		code := run(args, nil, &out, &errb)
		if code != tc.code {
			t.Errorf("%v: exit %d, want %d (stderr %q)", tc.args, code, tc.code, errb.String())
		}
		// protojson varies its spaces on purpose: compare without them.
		text, dense := out.String(), strings.Join(strings.Fields(out.String()), "")
		for _, s := range tc.has {
			if !strings.Contains(text, s) && !strings.Contains(dense, s) {
				t.Errorf("%v: output lacks %q:\n%s", tc.args, s, out.String())
			}
		}
		for _, s := range tc.not {
			if strings.Contains(out.String(), s) {
				t.Errorf("%v: output has %q:\n%s", tc.args, s, out.String())
			}
		}
	}
}

func TestRound(t *testing.T) {
	for _, tc := range []struct {
		in   time.Duration
		want string
	}{
		{59978569 * time.Microsecond, "59.979s"},
		{time.Minute, "1m0s"},
		{1500 * time.Microsecond, "2ms"},
		{500 * time.Nanosecond, "500ns"},
		{-59978569 * time.Microsecond, "-59.979s"},
	} {
		if got := Round(tc.in).String(); got != tc.want {
			t.Errorf("Round(%v) = %s, want %s", tc.in, got, tc.want)
		}
	}
}
