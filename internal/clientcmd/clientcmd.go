// Package clientcmd is the command line client of a charon server: the
// verbs ask, explain, usage, health, bench, reserve, release, transfer,
// seize and top. Each maps its flags to one call (or a Session stream, or a load run,
// or, for top, the debug port's /top of each replica) and prints the answer.
package clientcmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/charonlimit/charon/internal/tlsconfig"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// ErrUsage wraps a command line mistake (exit status 2); ErrReported is a
// failure whose details were already printed (exit status 1); ErrOverLimit
// is `charon ask --exit-code`'s answer OVER_LIMIT, printed already (exit
// status 3, apart from both, so a script tells a rejection from a failure).
var (
	ErrUsage     = errors.New("usage")
	ErrReported  = errors.New("failed")
	ErrOverLimit = errors.New("over limit")
)

// Verbs are the client verbs by name.
var Verbs = map[string]func(args []string, stdout, stderr io.Writer) error{
	"ask": Ask, "explain": Explain, "usage": Usage, "health": Health, "bench": Bench,
	"reserve": Reserve, "release": Release, "transfer": Transfer, "seize": Seize, "top": Top,
	"rlqs-sim": RLQSSim,
}

// ExitCode is a verb's exit status for err, which it prints to stderr
// unless it was reported already: 0 for nil and for -h, 2 for ErrUsage, 3
// for ErrOverLimit, else 1.
func ExitCode(err error, stderr io.Writer) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, ErrReported):
		return 1
	case errors.Is(err, ErrOverLimit):
		return 3
	}
	fmt.Fprintln(stderr, "charon:", err)
	if errors.Is(err, ErrUsage) {
		return 2
	}
	return 1
}

// ParseFlags parses a verb's flags; it refuses positional arguments.
func ParseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return err
		}
		return fmt.Errorf("%w: %v", ErrUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q", ErrUsage, fs.Arg(0))
	}
	return nil
}

// clientTLS declares the TLS flags of a client verb.
func clientTLS(fs *flag.FlagSet) *tlsconfig.ClientFlags {
	f := new(tlsconfig.ClientFlags)
	fs.BoolVar(&f.Force, "tls", false, "connect over TLS (implied by the other --tls-* flags)")
	f.Bind(fs, "tls-", "the server")
	return f
}

// connFlags are the flags of the verbs that call a server: its address,
// the time limit of each call, and TLS.
type connFlags struct {
	addr    string
	timeout time.Duration
	tls     *tlsconfig.ClientFlags
}

// verb makes the flag set of the verb charon NAME with the connection
// flags, to the server at localhost:8081 with a 5 s time limit by default.
func (c *connFlags) verb(name string, stderr io.Writer) *flag.FlagSet {
	fs := FlagSet(name, stderr)
	c.declare(fs, "localhost:8081", 5*time.Second)
	return fs
}

// FlagSet is the flag set of the verb charon NAME: errors and -h go to
// stderr, and parsing returns them (ParseFlags).
func FlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("charon "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

func (c *connFlags) declare(fs *flag.FlagSet, addr string, timeout time.Duration) {
	fs.StringVar(&c.addr, "addr", addr, "server gRPC `HOST:PORT`")
	fs.DurationVar(&c.timeout, "timeout", timeout, "time limit of each call")
	c.tls = clientTLS(fs)
}

// dial makes the client connection (gRPC connects on first use).
func (c *connFlags) dial() (*grpc.ClientConn, error) {
	transport, err := dialOption(c.tls)
	if err != nil {
		return nil, err
	}
	return grpc.NewClient(c.addr, transport)
}

// call runs f on a new connection, within --timeout.
func (c *connFlags) call(f func(context.Context, *grpc.ClientConn) error) error {
	cc, err := c.dial()
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	return f(ctx, cc)
}

// dialOption is a client verb's transport: TLS when its flags ask for it.
func dialOption(f *tlsconfig.ClientFlags) (grpc.DialOption, error) {
	cfg, err := f.Config()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	if cfg == nil {
		return grpc.WithTransportCredentials(insecure.NewCredentials()), nil
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(cfg)), nil
}

// Round rounds d for people: to the millisecond, so every duration a verb
// prints has at most three decimals ("59.979s", "1m0s"), except one under a
// millisecond, which would round to nothing.
func Round(d time.Duration) time.Duration {
	if d >= time.Millisecond || d <= -time.Millisecond {
		return d.Round(time.Millisecond)
	}
	return d
}
