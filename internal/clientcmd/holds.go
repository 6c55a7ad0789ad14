package clientcmd

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os/signal"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/sessionhold"
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
	r := &charonv1.Resource{Domain: *domain, Entries: protoEntries(es)}
	op := &charonv1.SessionRequest{Operation: &charonv1.SessionRequest_Reserve{Reserve: &charonv1.ReserveRequest{
		Resource: r, Copies: *copies, MinCopies: *minCopies, RequestId: *requestID,
	}}}
	return holdOnSession(hf, op, *holdFor, stdout)
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
	op := &charonv1.SessionRequest{Operation: &charonv1.SessionRequest_Seize{Seize: &charonv1.SeizeRequest{TransferId: *transfer}}}
	return holdOnSession(hf, op, *holdFor, stdout)
}

// holdOnSession runs op (a reserve or a seize) on its own Session stream
// until a signal or holdFor (package sessionhold).
func holdOnSession(hf connFlags, op *charonv1.SessionRequest, holdFor time.Duration, stdout io.Writer) error {
	sigCtx, stop := signalContext()
	defer stop()
	cc, err := hf.dial()
	if err != nil {
		return err
	}
	defer cc.Close()
	ok, err := sessionhold.Run(sigCtx, charonv1.NewCharonClient(cc), op, holdFor, hf.timeout, stdout)
	if err == nil && !ok {
		return ErrReported
	}
	return err
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
			return sessionhold.CallError(err)
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
