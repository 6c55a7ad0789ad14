package clientcmd

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/charonlimit/charon/internal/holds"
	"github.com/charonlimit/charon/internal/servertest"
)

// run runs a client verb as charon's main does, returning its exit status.
func run(args []string, _ func(string) string, stdout, stderr io.Writer) int {
	return ExitCode(Verbs[args[0]](args[1:], stdout, stderr), stderr)
}

func waitOutput(t *testing.T, b *servertest.Buffer, want string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(b.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("output %q never contained %q", b.String(), want)
		}
		time.Sleep(2 * time.Millisecond)
	}
	return b.String()
}

// lineAfter returns the word after prefix on the output's line starting
// with it.
func lineAfter(out, prefix string) string {
	for _, l := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(l, prefix); ok {
			return strings.Fields(rest)[0]
		}
	}
	return ""
}

func TestCopyVerbs(t *testing.T) {
	addr, copies := servertest.CopyServer(t)
	sigCtx, interrupt := context.WithCancel(context.Background())
	defer interrupt()
	old := signalContext
	signalContext = func() (context.Context, context.CancelFunc) { return context.WithCancel(sigCtx) }
	defer func() { signalContext = old }()

	var out, errOut servertest.Buffer
	code := make(chan int, 1)
	go func() {
		code <- run([]string{"reserve", "--addr", addr, "--domain", "c", "--descriptor", "db=a", "--copies", "5"}, nil, &out, &errOut)
	}()
	text := waitOutput(t, &out, "holding until interrupted")
	hold := lineAfter(text, "hold ")
	if hold == "" || !strings.Contains(text, "granted 3 copies") || !strings.Contains(text, "domain limit 3, held by the domain 3") {
		t.Fatalf("reserve printed %q", text)
	}

	var rel bytes.Buffer
	if c := run([]string{"release", "--addr", addr, "--hold", hold, "--copies", "1"}, nil, &rel, &errOut); c != 0 || !strings.Contains(rel.String(), "released 1 copies, 2 left") {
		t.Errorf("release: exit %d, %q %q", c, rel.String(), errOut.String())
	}
	// The transfer id alone on stdout, as T=$(charon transfer ...) takes it.
	var tr, trErr bytes.Buffer
	if c := run([]string{"transfer", "--addr", addr, "--hold", hold, "--copies", "1", "--ttl", "1m"}, nil, &tr, &trErr); c != 0 {
		t.Fatalf("transfer: exit %d, %q", c, trErr.String())
	}
	transferID := strings.TrimSuffix(tr.String(), "\n")
	if transferID == "" || strings.ContainsAny(transferID, " \n") || !strings.Contains(trErr.String(), "staged 1 copies") {
		t.Errorf("transfer printed %q on stdout, %q on stderr; want the id alone, then what was staged", tr.String(), trErr.String())
	}
	var sz bytes.Buffer
	if c := run([]string{"seize", "--addr", addr, "--transfer", transferID, "--hold-for", "1ms"}, nil, &sz, &errOut); c != 0 ||
		!strings.Contains(sz.String(), "seized 1 copies") || !strings.Contains(sz.String(), "released 1 copies") ||
		strings.Contains(sz.String(), "groups") {
		t.Errorf("seize: exit %d, %q %q; want the copies seized and released, no groups (the domain has none)", c, sz.String(), errOut.String())
	}
	if s := copies.Stats(); s.Copies != 1 {
		t.Errorf("copies held while reserve runs: %d, want 1", s.Copies)
	}
	interrupt()
	if c := <-code; c != 0 {
		t.Errorf("reserve exit %d, %q", c, errOut.String())
	}
	if !strings.Contains(out.String(), "released 1 copies") {
		t.Errorf("reserve printed %q", out.String())
	}
	if s := copies.Stats(); s.Copies != 0 {
		t.Errorf("copies held after reserve ended: %d", s.Copies)
	}
}

func TestCopyVerbErrors(t *testing.T) {
	addr, _ := servertest.CopyServer(t)
	old := signalContext
	signalContext = func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }
	defer func() { signalContext = old }()
	unknown, _ := holds.NewID("c/db")
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"reserve", "--addr", addr}, 2, "needs --domain"},
		{[]string{"reserve", "--addr", addr, "--domain", "c", "--descriptor", "nope=1"}, 1, "NotFound: resource:"},
		{[]string{"reserve", "--addr", addr, "--domain", "c", "--descriptor", "db=a", "--copies", "4", "--min", "4"}, 1, ""},
		{[]string{"release", "--addr", addr}, 2, "needs --hold"},
		{[]string{"release", "--addr", addr, "--hold", unknown}, 1, "NotFound: hold_id:"},
		{[]string{"transfer", "--addr", addr, "--hold", unknown}, 1, "NotFound: hold_id:"},
		{[]string{"seize", "--addr", addr, "--transfer", unknown}, 1, "NotFound: transfer_id:"},
		{[]string{"seize", "--addr", addr, "extra"}, 2, "unexpected argument"},
	} {
		var out, errOut bytes.Buffer
		c := run(tc.args, nil, &out, &errOut)
		if c != tc.code || !strings.Contains(errOut.String(), tc.msg) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and %q", tc.args, c, errOut.String(), tc.code, tc.msg)
		}
	}
}
