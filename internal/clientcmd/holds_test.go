package clientcmd

import (
	"bytes"
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
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

// holder runs `charon reserve` of copies of c/db=a against addr until the
// test interrupts it (or it ends), with checks every check; it returns
// the output, the interrupt and the exit status to come.
func holder(t *testing.T, addr string, copies string, check time.Duration) (*servertest.Buffer, context.CancelFunc, <-chan int) {
	t.Helper()
	oldCheck, oldSignal := checkEvery, signalContext
	checkEvery = check
	sigCtx, interrupt := context.WithCancel(context.Background())
	signalContext = func() (context.Context, context.CancelFunc) { return context.WithCancel(sigCtx) }
	t.Cleanup(func() {
		interrupt()
		checkEvery, signalContext = oldCheck, oldSignal
	})
	var out, errOut servertest.Buffer
	code := make(chan int, 1)
	go func() {
		code <- run([]string{"reserve", "--addr", addr, "--domain", "c", "--descriptor", "db=a", "--copies", copies}, nil, &out, &errOut)
	}()
	waitOutput(t, &out, "holding until interrupted")
	return &out, interrupt, code
}

// TestHoldTransferredAway: a holder whose copies are all transferred away
// ends cleanly, saying so: on its own at its next check, or, interrupted
// before one, with nothing left to release; never with the NotFound of a
// release of a hold that is gone.
func TestHoldTransferredAway(t *testing.T) {
	for _, tc := range []struct {
		name      string
		check     time.Duration
		interrupt bool
		want      string
	}{
		{"the check sees it", 5 * time.Millisecond, false, "is gone: its copies were all transferred (charon transfer) or released by another client (charon release); nothing left to hold"},
		{"interrupted before a check", time.Hour, true, "is gone: its copies were all transferred (charon transfer) or released by another client (charon release); nothing left to release"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, copies := servertest.CopyServer(t)
			out, interrupt, code := holder(t, addr, "2", tc.check)
			hold := lineAfter(out.String(), "hold ")
			var tr, trErr bytes.Buffer
			if c := run([]string{"transfer", "--addr", addr, "--hold", hold}, nil, &tr, &trErr); c != 0 {
				t.Fatalf("transfer: exit %d, %q", c, trErr.String())
			}
			if tc.interrupt {
				interrupt()
			}
			if c := <-code; c != 0 {
				t.Errorf("reserve: exit %d, output %q; want 0", c, out.String())
			}
			if got := out.String(); !strings.Contains(got, "hold "+hold+" "+tc.want) || strings.Contains(got, "NotFound") {
				t.Errorf("output %q, want %q and no NotFound", got, tc.want)
			}
			if s := copies.Stats(); s.Copies != 2 {
				t.Errorf("copies staged: %d, want the 2 transferred", s.Copies)
			}
		})
	}
}

// TestHoldCheckKeepsAHold: the checks of a hold that is there change
// nothing: the holder waits on, and releases its copies when interrupted.
func TestHoldCheckKeepsAHold(t *testing.T) {
	checks := make(chan struct{}, 1)
	checked = func() {
		select {
		case checks <- struct{}{}:
		default:
		}
	}
	defer func() { checked = nil }()
	addr, copies := servertest.CopyServer(t)
	out, interrupt, code := holder(t, addr, "1", time.Millisecond)
	for range 3 {
		select {
		case <-checks:
		case c := <-code:
			t.Fatalf("reserve ended before its checks: exit %d, %q", c, out.String())
		case <-time.After(10 * time.Second):
			t.Fatal("no check within 10s")
		}
	}
	if s := copies.Stats(); s.Copies != 1 {
		t.Errorf("copies held after 3 checks: %d, want 1", s.Copies)
	}
	interrupt()
	if c := <-code; c != 0 || !strings.Contains(out.String(), "released 1 copies") || strings.Contains(out.String(), "is gone") {
		t.Errorf("reserve: exit %d, %q; want the hold kept, then released", c, out.String())
	}
	if s := copies.Stats(); s.Copies != 0 {
		t.Errorf("copies held after the holder ended: %d", s.Copies)
	}
}

// TestPrintSeize: a seize prints the groups its copies count against only
// when there are any, and the domain's groups now when they changed.
func TestPrintSeize(t *testing.T) {
	base := func(groups, now []string) *charonv1.SeizeResponse {
		return &charonv1.SeizeResponse{HoldId: "h", Copies: 2, FencingToken: 7, Groups: groups, CurrentGroups: now,
			Target: &charonv1.Target{Resource: "c/db", Domain: "a"}}
	}
	for _, tc := range []struct {
		r    *charonv1.SeizeResponse
		want string
	}{
		{base(nil, nil), "resource c/db domain \"a\"\n"},
		{base([]string{"g1", "g2"}, []string{"g1", "g2"}), "resource c/db domain \"a\" groups g1,g2\n"},
		{base([]string{"g1"}, []string{"g2"}), "resource c/db domain \"a\" groups g1 (the domain's groups now: g2)\n"},
		{base([]string{"g1"}, nil), "resource c/db domain \"a\" groups g1 (the domain is in no group now)\n"},
	} {
		var b strings.Builder
		printSeize(&b, tc.r)
		if want := "hold h\nseized 2 copies (fencing token 7)\n" + tc.want; b.String() != want {
			t.Errorf("printed %q, want %q", b.String(), want)
		}
	}
}

// endOnCheck is a Charon server whose Session grants a reserve and ends
// the stream when the next operation (a holder's check) arrives, as a
// server does with a session it dropped meanwhile.
type endOnCheck struct {
	charonv1.UnimplementedCharonServer
}

func (endOnCheck) Session(st grpc.BidiStreamingServer[charonv1.SessionRequest, charonv1.SessionResponse]) error {
	req, err := st.Recv()
	if err != nil {
		return err
	}
	if err := st.Send(&charonv1.SessionResponse{Id: req.GetId(), Result: &charonv1.SessionResponse_Reserve{Reserve: &charonv1.ReserveResponse{
		Ok: true, HoldId: "h", Granted: 1}}}); err != nil {
		return err
	}
	if _, err := st.Recv(); err != nil {
		return err
	}
	return status.Error(codes.Unavailable, "session lease could not be renewed, its holds are dropped")
}

// TestSessionEndedAtACheck: a stream that ends while a check waits for its
// answer is the session's end, said, and a failure (exit 1); the holder
// does not wait on for a message that will not come.
func TestSessionEndedAtACheck(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	charonv1.RegisterCharonServer(srv, endOnCheck{})
	go srv.Serve(ln)
	defer srv.Stop()
	out, _, code := holder(t, ln.Addr().String(), "1", time.Millisecond)
	select {
	case c := <-code:
		if c != 1 || !strings.Contains(out.String(), "the session ended; the server released the hold: Unavailable: session lease") {
			t.Errorf("reserve: exit %d, %q; want 1, the session's end said", c, out.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the holder did not notice its session had ended; output %q", out.String())
	}
}
