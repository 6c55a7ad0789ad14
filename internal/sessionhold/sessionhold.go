// Package sessionhold holds copies of a copy-limited resource on a
// charon.v1 Session stream for as long as a command runs: the runtime of
// `charon reserve` and `charon seize`. If the process dies, the stream ends
// and the server releases the hold.
package sessionhold

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
)

// CallError turns a gRPC error into a message with its code.
func CallError(err error) error {
	if s, ok := status.FromError(err); ok {
		return fmt.Errorf("%s: %s", s.Code(), s.Message())
	}
	return err
}

// Run runs op (a reserve or a seize) on a new Session stream of c, prints
// the hold to stdout, waits until sigCtx ends or holdFor (0: until sigCtx
// ends) has passed, then releases what is left of the hold and closes the
// stream (which releases it anyway). A hold that is gone meanwhile (its
// copies all transferred, or released by another client), seen by a
// keep-alive every checkEvery, ends the wait with nothing to release: said
// on stdout, not an error. Every call waits at most timeout for its
// answer. ok is false when the reserve was rejected (printed).
func Run(sigCtx context.Context, c charonv1.CharonClient, op *charonv1.SessionRequest, holdFor, timeout time.Duration, stdout io.Writer) (ok bool, err error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel() // ends the stream: the server releases the session's holds
	st, err := c.Session(ctx)
	if err != nil {
		return false, CallError(err)
	}
	// One reader owns the stream's receiving side: answers to calls, and
	// the stream's end while the hold waits (the server ended the session:
	// its holds are released).
	type msg struct {
		resp *charonv1.SessionResponse
		err  error
	}
	msgs := make(chan msg, 1)
	go func() {
		for {
			resp, err := st.Recv()
			select {
			case msgs <- msg{resp, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	// ended is the stream's end once a call has read it (the reader then
	// sends nothing more).
	var ended error
	call := func(req *charonv1.SessionRequest) (*charonv1.SessionResponse, error) {
		req.Id++
		if err := st.Send(req); err != nil {
			return nil, CallError(err)
		}
		var m msg
		select {
		case m = <-msgs:
			if m.err != nil {
				ended = m.err
				return nil, CallError(m.err)
			}
		case <-time.After(timeout):
			return nil, fmt.Errorf("no answer in %v", timeout)
		}
		if e := m.resp.GetError(); e != nil {
			return nil, fmt.Errorf("%s: %s", codeName(e.GetCode()), e.GetMessage())
		}
		return m.resp, nil
	}
	resp, err := call(op)
	if err != nil {
		return false, err
	}
	var holdID string
	switch r := resp.GetResult().(type) {
	case *charonv1.SessionResponse_Reserve:
		PrintReservation(stdout, r.Reserve)
		if !r.Reserve.GetOk() {
			return false, nil
		}
		holdID = r.Reserve.GetHoldId()
	case *charonv1.SessionResponse_Seize:
		printSeize(stdout, r.Seize)
		holdID = r.Seize.GetHoldId()
	default:
		return false, fmt.Errorf("unexpected answer %v", resp)
	}
	var until <-chan time.Time
	if holdFor > 0 {
		fmt.Fprintf(stdout, "holding for %v (interrupt to release now)\n", holdFor)
		t := time.NewTimer(holdFor)
		defer t.Stop()
		until = t.C
	} else {
		fmt.Fprintln(stdout, "holding until interrupted")
	}
	// Every checkEvery, a keep-alive of the stream's holds says whether
	// the hold is still there: once its copies are all transferred away
	// (or released by another client), there is nothing left to hold and
	// the holder ends.
	check := time.NewTicker(checkEvery)
	defer check.Stop()
wait:
	for {
		select {
		case <-until:
			break wait
		case <-sigCtx.Done():
			break wait
		case <-check.C:
			r, err := call(&charonv1.SessionRequest{Operation: &charonv1.SessionRequest_KeepAlive{KeepAlive: &charonv1.KeepAliveRequest{}}})
			if checked != nil {
				checked()
			}
			switch {
			case err == nil && r.GetKeepAlive().GetHolds() == 0:
				fmt.Fprintf(stdout, "hold %s is gone: %s; nothing left to hold\n", holdID, goneWhy)
				st.CloseSend()
				return true, nil
			case ended != nil:
				return true, sessionEnded(stdout, ended)
			}
			// Another failed check changes nothing: a stream that ends
			// is read next.
		case m := <-msgs:
			if m.err == nil && m.resp.GetKeepAlive() != nil {
				continue // a check's answer that came after its time limit
			}
			// Nothing was asked: the session ended (the server stopped, or
			// dropped a client that did not answer its pings).
			err := m.err
			if err == nil {
				err = fmt.Errorf("unexpected message %v", m.resp)
			}
			return true, sessionEnded(stdout, err)
		}
	}
	rel, err := call(&charonv1.SessionRequest{Id: op.Id, Operation: &charonv1.SessionRequest_Release{Release: &charonv1.ReleaseRequest{HoldId: holdID}}})
	switch {
	case err == nil:
		fmt.Fprintf(stdout, "released %d copies\n", rel.GetRelease().GetReleased())
	case strings.HasPrefix(err.Error(), "NotFound"):
		// Gone since the last check.
		fmt.Fprintf(stdout, "hold %s is gone: %s; nothing left to release\n", holdID, goneWhy)
	default:
		// Closing the stream releases the hold anyway.
		fmt.Fprintln(stdout, "release failed; closing the session releases the hold:", err)
	}
	st.CloseSend()
	return true, nil
}

// checkEvery is how often a holder asks whether its hold is still there.
var checkEvery = 5 * time.Second

// checked, when set (by tests), is called after each check.
var checked func()

// goneWhy is why a hold of a live session can be gone.
const goneWhy = "its copies were all transferred (charon transfer) or released by another client (charon release)"

// printSeize prints a seize answer: the hold, and the groups its copies
// count against when they are any.
func printSeize(w io.Writer, s *charonv1.SeizeResponse) {
	fmt.Fprintf(w, "hold %s\nseized %d copies (fencing token %d)\nresource %s domain %q", s.GetHoldId(), s.GetCopies(), s.GetFencingToken(),
		s.GetTarget().GetResource(), s.GetTarget().GetDomain())
	if gs := s.GetGroups(); len(gs) > 0 {
		fmt.Fprintf(w, " groups %s", strings.Join(gs, ","))
	}
	if now := s.GetCurrentGroups(); !slices.Equal(now, s.GetGroups()) {
		if len(now) == 0 {
			fmt.Fprint(w, " (the domain is in no group now)")
		} else {
			fmt.Fprintf(w, " (the domain's groups now: %s)", strings.Join(now, ","))
		}
	}
	fmt.Fprintln(w)
}

// sessionEnded says that the server ended the session while the hold
// waited, and returns ErrSessionEnded with why.
func sessionEnded(stdout io.Writer, err error) error {
	fmt.Fprintln(stdout, "the session ended; the server released the hold:", CallError(err))
	return fmt.Errorf("%w: %v", ErrSessionEnded, CallError(err))
}

// ErrSessionEnded reports that the server ended the session while the
// hold waited: the hold was released.
var ErrSessionEnded = errors.New("the session ended and its holds were released")

func codeName(c int32) string { return codes.Code(c).String() }

// PrintReservation prints a reserve answer: the hold or why it was
// rejected, and the copies held around it.
func PrintReservation(w io.Writer, r *charonv1.ReserveResponse) {
	if r.GetOk() {
		fmt.Fprintf(w, "hold %s\ngranted %d copies (fencing token %d)", r.GetHoldId(), r.GetGranted(), r.GetFencingToken())
		if r.GetReplayed() {
			fmt.Fprint(w, ", replayed")
		}
		fmt.Fprintln(w)
	} else if r.GetHoldGone() {
		fmt.Fprintf(w, "replayed: hold %s of this request id is gone (released, transferred or lapsed); nothing is held\n", r.GetHoldId())
	} else {
		fmt.Fprint(w, "rejected")
		switch {
		case r.GetLimitedByGroup() != "":
			fmt.Fprintf(w, ": group %s is full", r.GetLimitedByGroup())
		case r.GetLimitedByGlobal():
			fmt.Fprint(w, ": global limit reached")
		case r.GetLimitedByDomain():
			fmt.Fprint(w, ": domain limit reached")
		}
		fmt.Fprintln(w)
	}
	x := r.GetContext()
	fmt.Fprintf(w, "resource %s domain %q\n", r.GetTarget().GetResource(), r.GetTarget().GetDomain())
	fmt.Fprintf(w, "domain limit %d, held by the domain %d", x.GetDomainLimit(), x.GetDomainHolds())
	if x.GetGlobalLimit() > 0 {
		fmt.Fprintf(w, "; global limit %d", x.GetGlobalLimit())
	}
	fmt.Fprintf(w, "; held by all %d\n", x.GetTotalHolds())
	for _, g := range x.GetGroups() {
		fmt.Fprintf(w, "group %s limit %d, held %d\n", g.GetName(), g.GetLimit(), g.GetHolds())
	}
}
