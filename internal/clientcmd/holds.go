package clientcmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
	"github.com/charonlimit/charon/client"
	"github.com/charonlimit/charon/descriptors"
)

// The copy verbs: reserve and seize hold their copies on a Session stream
// while they run (the server releases them if the process dies), release
// and transfer are unary and act on any hold by its id.

// signalContext is done on SIGINT or SIGTERM; tests replace it.
var signalContext = func() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
}

// Reserve is `charon reserve`: copies held on a Session stream until
// interrupted or --hold-for.
func Reserve(args []string, stdout, stderr io.Writer) error {
	var hf connFlags
	fs := hf.verb("reserve", stderr)
	domain := fs.String("domain", "", "RLS domain")
	descriptor := fs.String("descriptor", "", "the resource's descriptor `k=v,k2=v2`")
	copies := fs.Int64("copies", 1, "copies to reserve at most")
	minCopies := fs.Int64("min", 0, "copies to reserve at least (0: 1)")
	requestID := fs.String("request-id", "", "makes the reserve idempotent")
	holdFor := fs.Duration("hold-for", 0, "release after this long (0: hold until interrupted)")
	if err := ParseFlags(fs, args); err != nil {
		return err
	}
	if *domain == "" || *descriptor == "" {
		return fmt.Errorf("%w: reserve needs --domain and --descriptor", ErrUsage)
	}
	es, err := descriptors.ParseDescriptor(*descriptor)
	if err != nil {
		return fmt.Errorf("%w: --descriptor: %v", ErrUsage, err)
	}
	r := client.Resource{Domain: *domain}
	for _, e := range es {
		r.Entries = append(r.Entries, client.Entry{Key: e.Key, Value: e.Value})
	}
	return holdOnSession(hf, func(ctx context.Context, c *client.Client) (*client.Hold, error) {
		return c.ReserveID(ctx, *requestID, r, *copies, *minCopies, 0)
	}, *holdFor, stdout)
}

// Seize is `charon seize`: transferred copies held like Reserve's.
func Seize(args []string, stdout, stderr io.Writer) error {
	var hf connFlags
	fs := hf.verb("seize", stderr)
	transfer := fs.String("transfer", "", "the transfer `ID` to seize")
	holdFor := fs.Duration("hold-for", 0, "release after this long (0: hold until interrupted)")
	if err := ParseFlags(fs, args); err != nil {
		return err
	}
	if *transfer == "" {
		return fmt.Errorf("%w: seize needs --transfer", ErrUsage)
	}
	return holdOnSession(hf, func(ctx context.Context, c *client.Client) (*client.Hold, error) {
		return c.Seize(ctx, *transfer)
	}, *holdFor, stdout)
}

// holdOnSession takes a hold with take (a reserve or a seize) on the
// Session stream of a client (package client, as a library user would),
// prints it, and holds it until a signal or holdFor (0: until a signal)
// has passed, then releases it; ending the stream releases it anyway, so
// a holder that dies gives its copies back. A rejected reserve is printed
// and ErrReported.
func holdOnSession(hf connFlags, take func(context.Context, *client.Client) (*client.Hold, error), holdFor time.Duration, stdout io.Writer) error {
	sigCtx, stop := signalContext()
	defer stop()
	cc, err := hf.dial()
	if err != nil {
		return err
	}
	defer cc.Close()
	c := client.New(cc, client.Options{CloseTimeout: hf.timeout})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), hf.timeout)
	h, err := take(ctx, c)
	cancel()
	if err != nil {
		return callError(err)
	}
	if r := h.Reply(); r != nil {
		printReservation(stdout, r)
	} else {
		printSeize(stdout, h.Seized())
	}
	if !h.OK() {
		return ErrReported
	}
	return holdUntil(sigCtx, h, holdFor, hf.timeout, stdout)
}

// holdUntil waits until sigCtx ends or holdFor has passed, then releases
// the hold. A hold that is gone meanwhile (its copies all transferred, or
// released by another client), seen by a check every checkEvery, ends the
// wait with nothing to release: said on stdout, not an error. A session
// that ends is said and returned as an error wrapping
// client.ErrSessionLost.
func holdUntil(sigCtx context.Context, h *client.Hold, holdFor, timeout time.Duration, stdout io.Writer) error {
	var until <-chan time.Time
	if holdFor > 0 {
		fmt.Fprintf(stdout, "holding for %v (interrupt to release now)\n", holdFor)
		t := time.NewTimer(holdFor)
		defer t.Stop()
		until = t.C
	} else {
		fmt.Fprintln(stdout, "holding until interrupted")
	}
	check := time.NewTicker(checkEvery)
	defer check.Stop()
wait:
	for {
		select {
		case <-until:
			break wait
		case <-sigCtx.Done():
			break wait
		case <-h.Lost():
			// The server ended the session (it stopped, or dropped a
			// client that did not answer its pings).
			return sessionEnded(stdout, h.Err())
		case <-check.C:
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			err := h.Check(ctx)
			cancel()
			if checked != nil {
				checked()
			}
			switch {
			case errors.Is(err, client.ErrHoldGone):
				fmt.Fprintf(stdout, "hold %s is gone: %s; nothing left to hold\n", h.ID(), goneWhy)
				return nil
			case errors.Is(err, client.ErrSessionLost):
				return sessionEnded(stdout, err)
			}
			// Another failed check changes nothing: a session that ends
			// closes Lost.
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	n, err := h.ReleaseAll(ctx)
	switch {
	case err == nil:
		fmt.Fprintf(stdout, "released %d copies\n", n)
	case errors.Is(err, client.ErrHoldGone):
		// Gone since the last check.
		fmt.Fprintf(stdout, "hold %s is gone: %s; nothing left to release\n", h.ID(), goneWhy)
	default:
		// Closing the stream releases the hold anyway.
		fmt.Fprintln(stdout, "release failed; closing the session releases the hold:", callError(err))
	}
	return nil
}

// checkEvery is how often a holder asks whether its hold is still there.
var checkEvery = 5 * time.Second

// checked, when set (by tests), is called after each check.
var checked func()

// goneWhy is why a hold of a live session can be gone.
const goneWhy = "its copies were all transferred (charon transfer) or released by another client (charon release)"

// sessionEnded says that the server ended the session while the hold
// waited, and returns err, which wraps client.ErrSessionLost.
func sessionEnded(stdout io.Writer, err error) error {
	fmt.Fprintln(stdout, "the session ended; the server released the hold:", callError(err))
	return fmt.Errorf("the session ended and its holds were released: %w", err)
}

// callError is err as a message: a gRPC status (the server's answer,
// wrapped or not) as its code and message.
func callError(err error) error {
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		s := se.GRPCStatus()
		return fmt.Errorf("%s: %s", s.Code(), s.Message())
	}
	return err
}

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

// printReservation prints a reserve answer: the hold or why it was
// rejected, and the copies held around it.
func printReservation(w io.Writer, r *charonv1.ReserveResponse) {
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

// holdVerb is release's and transfer's flags: a hold, and how many of its
// copies.
type holdVerb struct {
	connFlags
	hold   string
	copies int64
}

func (h *holdVerb) declare(verb string, stderr io.Writer) *flag.FlagSet {
	fs := h.verb(verb, stderr)
	fs.StringVar(&h.hold, "hold", "", "the hold `ID`")
	fs.Int64Var(&h.copies, "copies", 0, "copies to "+verb+" (0: all the hold has)")
	return fs
}

func (h *holdVerb) parse(fs *flag.FlagSet, verb string, args []string) error {
	if err := ParseFlags(fs, args); err != nil {
		return err
	}
	if h.hold == "" {
		return fmt.Errorf("%w: %s needs --hold", ErrUsage, verb)
	}
	return nil
}

// Release is `charon release`: copies of any hold released by its id.
func Release(args []string, stdout, stderr io.Writer) error {
	var h holdVerb
	if err := h.parse(h.declare("release", stderr), "release", args); err != nil {
		return err
	}
	return h.unary(func(ctx context.Context, c charonv1.CharonClient) error {
		r, err := c.Release(ctx, &charonv1.ReleaseRequest{HoldId: h.hold, Copies: h.copies})
		if err == nil {
			fmt.Fprintf(stdout, "released %d copies, %d left on the hold\n", r.GetReleased(), r.GetRemaining())
		}
		return err
	})
}

// unary runs one call of a copy verb on a new connection, within --timeout.
func (h *connFlags) unary(call func(context.Context, charonv1.CharonClient) error) error {
	return h.call(func(ctx context.Context, cc *grpc.ClientConn) error {
		if err := call(ctx, charonv1.NewCharonClient(cc)); err != nil {
			return callError(err)
		}
		return nil
	})
}

// Transfer is `charon transfer`: copies of a hold staged for a seize;
// prints the transfer id alone on stdout (for T=$(charon transfer ...)) and
// what was staged on stderr.
func Transfer(args []string, stdout, stderr io.Writer) error {
	var h holdVerb
	fs := h.declare("transfer", stderr)
	ttl := fs.Duration("ttl", 0, "how long the copies wait for a seize (0: the server's default)")
	if err := h.parse(fs, "transfer", args); err != nil {
		return err
	}
	if *ttl < 0 {
		return fmt.Errorf("%w: --ttl must not be negative", ErrUsage)
	}
	req := &charonv1.TransferRequest{HoldId: h.hold, Copies: h.copies}
	if *ttl > 0 {
		req.Ttl = durationpb.New(*ttl)
	}
	return h.unary(func(ctx context.Context, c charonv1.CharonClient) error {
		r, err := c.Transfer(ctx, req)
		if err == nil {
			fmt.Fprintln(stdout, r.GetTransferId())
			fmt.Fprintf(stderr, "staged %d copies until %s, %d left on the hold\n", r.GetCopies(), r.GetExpires().AsTime().Format(time.RFC3339), r.GetRemaining())
		}
		return err
	})
}
