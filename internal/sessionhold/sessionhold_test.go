package sessionhold

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
	"github.com/charonlimit/charon/internal/servertest"
)

func reserveOp(copies int64) *charonv1.SessionRequest {
	return &charonv1.SessionRequest{Operation: &charonv1.SessionRequest_Reserve{Reserve: &charonv1.ReserveRequest{
		Resource: &charonv1.Resource{Domain: "c", Entries: []*charonv1.Entry{{Key: "db", Value: "a"}}}, Copies: copies}}}
}

func waitFor(t *testing.T, b *servertest.Buffer, want string) string {
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
			old := checkEvery
			checkEvery = tc.check
			defer func() { checkEvery = old }()
			addr, copies := servertest.CopyServer(t)
			cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			c := charonv1.NewCharonClient(cc)
			sigCtx, interrupt := context.WithCancel(context.Background())
			defer interrupt()
			var out servertest.Buffer
			type result struct {
				ok  bool
				err error
			}
			done := make(chan result, 1)
			go func() {
				ok, err := Run(sigCtx, c, reserveOp(2), 0, 10*time.Second, &out)
				done <- result{ok, err}
			}()
			text := waitFor(t, &out, "holding until interrupted")
			hold := strings.Fields(strings.TrimPrefix(text, "hold "))[0]
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := c.Transfer(ctx, &charonv1.TransferRequest{HoldId: hold}); err != nil {
				t.Fatal(err)
			}
			if tc.interrupt {
				interrupt()
			}
			r := <-done
			if !r.ok || r.err != nil {
				t.Errorf("Run: %v, %v; want true, nil", r.ok, r.err)
			}
			got := out.String()
			if !strings.Contains(got, "hold "+hold+" "+tc.want) || strings.Contains(got, "NotFound") {
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
	old := checkEvery
	checkEvery = time.Millisecond
	checks := make(chan struct{}, 1)
	checked = func() {
		select {
		case checks <- struct{}{}:
		default:
		}
	}
	defer func() { checkEvery, checked = old, nil }()
	addr, copies := servertest.CopyServer(t)
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	sigCtx, interrupt := context.WithCancel(context.Background())
	defer interrupt()
	var out servertest.Buffer
	type result struct {
		ok  bool
		err error
	}
	done := make(chan result, 1)
	go func() {
		ok, err := Run(sigCtx, charonv1.NewCharonClient(cc), reserveOp(1), 0, 10*time.Second, &out)
		done <- result{ok, err}
	}()
	for range 3 {
		select {
		case <-checks:
		case r := <-done:
			t.Fatalf("Run ended before its checks: %v, %v, %q", r.ok, r.err, out.String())
		case <-time.After(10 * time.Second):
			t.Fatal("no check within 10s")
		}
	}
	if s := copies.Stats(); s.Copies != 1 {
		t.Errorf("copies held after 3 checks: %d, want 1", s.Copies)
	}
	interrupt()
	r := <-done
	if !r.ok || r.err != nil || !strings.Contains(out.String(), "released 1 copies") || strings.Contains(out.String(), "is gone") {
		t.Errorf("Run: %v, %v, %q; want the hold kept, then released", r.ok, r.err, out.String())
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
// answer is the session's end, said and returned as ErrSessionEnded; the
// holder does not wait on for a message that will not come.
func TestSessionEndedAtACheck(t *testing.T) {
	old := checkEvery
	checkEvery = time.Millisecond
	defer func() { checkEvery = old }()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	charonv1.RegisterCharonServer(srv, endOnCheck{})
	go srv.Serve(ln)
	defer srv.Stop()
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	var out servertest.Buffer
	done := make(chan error, 1)
	go func() {
		_, err := Run(context.Background(), charonv1.NewCharonClient(cc), reserveOp(1), 0, 10*time.Second, &out)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, ErrSessionEnded) || !strings.Contains(out.String(), "the session ended; the server released the hold: Unavailable: session lease") {
			t.Errorf("Run: %v, %q; want ErrSessionEnded, said", err, out.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the holder did not notice its session had ended; output %q", out.String())
	}
}
