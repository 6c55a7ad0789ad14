// Command charon is the Charon rate limit service and its tools: serve
// (serve.go wires the server and its services), version, the verbs that
// need no server of package offlinecmd (config check and diff, suggest,
// replay, sim, escrow-sim) and the client verbs of package clientcmd (ask, explain,
// usage, top, health, bench, rlqs-sim and the copy verbs). Each verb maps
// its flags and environment to the Options of the packages that do the
// work.
package main

import (
	"fmt"
	"io"
	"os"
	"path"
	"runtime/debug"
	// The IANA time zones of calendar quotas (quota.time_zone), built in so
	// that an image without /usr/share/zoneinfo (distroless) loads them.
	_ "time/tzdata"

	"github.com/charonlimit/charon/internal/clientcmd"
	"github.com/charonlimit/charon/internal/offlinecmd"
)

// version is set with -ldflags "-X main.version=..."; otherwise the module
// version or "dev".
var version = ""

const usage = `charon: a rate limit service for Envoy (RLS v3) with burst tiers.

Usage:
  charon serve [flags]                     serve gRPC RLS, HTTP /json and debug endpoints
  charon config check DIR [--dump]         validate a configuration directory
  charon config diff OLD NEW [--json]      what changes from one configuration to another: rules, limits, matches
  charon ask --domain D --descriptor k=v   ask a running server for a decision
  charon explain --domain D --descriptor k=v
                                           why a request is limited: its pairs' state
  charon usage --domain D --descriptor k=v how much of each limit and quota is used, when it renews
  charon top [--addr DEBUG1,DEBUG2] [--domain D]
                                           who is being limited, by which rule, live (debug ports' /top)
  charon suggest --log FILE [--config DIR] [--reject 0.01] [--out DIR]
                                           propose limits from a decision log
  charon replay --log FILE --config DIR [--against DIR] [--json]
                                           what a configuration would have answered to a logged day's requests
  charon sim [--addr HOST:PORT] [--out DIR]
                                           the tier simulator in a browser (also /sim/ on serve's HTTP port)
  charon bench [flags]                     load a running server and report throughput
  charon health [--addr HOST:PORT]         exit 0 when a server's gRPC health is SERVING
  charon rlqs-sim --domain D --bucket k=v [--envoys 20 --skew 10]
                                           simulated Envoy rate_limit_quota filters against a server's RLQS
  charon escrow-sim [--replicas 3 --regions 1 --rate 10]
                                           replicas deciding a limit from escrow leases, simulated in this process
  charon reserve --domain D --descriptor k=v [--copies N --min M] [--hold-for DUR]
                                           hold copies of a copy-limited resource while running
  charon release --hold ID [--copies N]    release copies of a hold
  charon transfer --hold ID [--copies N] [--ttl DUR]
                                           stage copies of a hold; prints the transfer id
  charon seize --transfer ID [--hold-for DUR]
                                           hold transferred copies while running
  charon version                           print the version

Run as ratelimit (the image's /bin/ratelimit, envoyproxy/ratelimit's command),
or given /bin/ratelimit as its verb, charon serves: charon serve [flags].

Run "charon VERB -h" for a verb's flags.
`

func main() {
	os.Exit(run(commandArgs(os.Args), os.Getenv, os.Stdout, os.Stderr))
}

// commandArgs returns the verb and its arguments from the command line
// argv (argv[0] included). envoyproxy/ratelimit's deployments start its
// image with the command /bin/ratelimit and no arguments, its environment
// saying the rest: so run as ratelimit (the image links /bin/ratelimit to
// charon), or given /bin/ratelimit as the verb (Compose's command: beside
// the image's entrypoint), the verb is serve and every argument is serve's.
func commandArgs(argv []string) []string {
	isRatelimit := func(a string) bool { return path.Base(a) == lyftCommand }
	switch {
	case len(argv) == 0:
		return nil
	case isRatelimit(argv[0]):
		return append([]string{"serve"}, argv[1:]...)
	case len(argv) > 1 && isRatelimit(argv[1]):
		return append([]string{"serve"}, argv[2:]...)
	}
	return argv[1:]
}

// lyftCommand is the name of envoyproxy/ratelimit's binary (/bin/ratelimit
// in its image).
const lyftCommand = "ratelimit"

func run(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch verb := args[0]; verb {
	case "serve":
		err = runServe(args[1:], getenv, stderr)
	case "config":
		return offlinecmd.Config(args[1:], loadFlags(getenv), stdout, stderr)
	case "version", "--version", "-version":
		fmt.Fprintln(stdout, "charon", versionString())
		return 0
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		if f, ok := offlinecmd.Verbs[verb]; ok {
			err = f(args[1:], loadFlags(getenv), stdout, stderr)
			break
		}
		f, ok := clientcmd.Verbs[verb]
		if !ok {
			fmt.Fprintf(stderr, "charon: unknown verb %q\n\n%s", verb, usage)
			return 2
		}
		err = f(args[1:], stdout, stderr)
	}
	return clientcmd.ExitCode(err, stderr)
}

func versionString() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}
