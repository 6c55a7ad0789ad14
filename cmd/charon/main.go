// Command charon is the Charon rate limit service and its tools: serve,
// config check, ask, bench and version. Each verb maps its flags and
// environment to the Options of the packages that do the work.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"time"

	"github.com/charonlimit/charon/internal/tlsconfig"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// version is set with -ldflags "-X main.version=..."; otherwise the module
// version or "dev".
var version = ""

const usage = `charon: a rate limit service for Envoy (RLS v3) with burst tiers.

Usage:
  charon serve [flags]                     serve gRPC RLS, HTTP /json and debug endpoints
  charon config check DIR [--dump]         validate a configuration directory
  charon ask --domain D --descriptor k=v   ask a running server for a decision
  charon explain --domain D --descriptor k=v
                                           why a request is limited: its pairs' state
  charon suggest --log FILE [--reject 0.01] [--out DIR]
                                           propose limits from a decision log
  charon sim [--addr HOST:PORT] [--out DIR]
                                           the tier simulator in a browser (also /sim/ on serve's HTTP port)
  charon bench [flags]                     load a running server and report throughput
  charon health [--addr HOST:PORT]         exit 0 when a server's gRPC health is SERVING
  charon reserve --domain D --descriptor k=v [--copies N --min M] [--hold-for DUR]
                                           hold copies of a copy-limited resource while running
  charon release --hold ID [--copies N]    release copies of a hold
  charon transfer --hold ID [--copies N] [--ttl DUR]
                                           stage copies of a hold; prints the transfer id
  charon seize --transfer ID [--hold-for DUR]
                                           hold transferred copies while running
  charon version                           print the version

Run "charon VERB -h" for a verb's flags.
`

// errUsage is a command line mistake (exit status 2).
var errUsage = errors.New("usage")

func main() {
	os.Exit(run(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

func run(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "serve":
		err = runServe(args[1:], getenv, stderr)
	case "config":
		if len(args) < 2 || args[1] != "check" {
			fmt.Fprintln(stderr, "usage: charon config check DIR [--dump] [--merge-domains]")
			return 2
		}
		err = runCheck(args[2:], stdout, stderr)
	case "ask":
		err = runAsk(args[1:], stdout, stderr)
	case "explain":
		err = runExplain(args[1:], stdout, stderr)
	case "suggest":
		err = runSuggest(args[1:], stdout, stderr)
	case "sim":
		err = runSim(args[1:], stdout, stderr)
	case "bench":
		err = runBench(args[1:], stdout, stderr)
	case "health":
		err = runHealth(args[1:], stdout, stderr)
	case "reserve":
		err = runReserve(args[1:], stdout, stderr)
	case "release":
		err = runRelease(args[1:], stdout, stderr)
	case "transfer":
		err = runTransfer(args[1:], stdout, stderr)
	case "seize":
		err = runSeize(args[1:], stdout, stderr)
	case "version", "--version", "-version":
		fmt.Fprintln(stdout, "charon", versionString())
		return 0
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "charon: unknown verb %q\n\n%s", args[0], usage)
		return 2
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		fmt.Fprintln(stderr, "charon:", err)
		return 2
	case errors.Is(err, errReported):
		return 1
	default:
		fmt.Fprintln(stderr, "charon:", err)
		return 1
	}
}

// errReported is a failure whose details were already printed.
var errReported = errors.New("failed")

func versionString() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
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
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	if cfg == nil {
		return grpc.WithTransportCredentials(insecure.NewCredentials()), nil
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(cfg)), nil
}
