package clientcmd

import (
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/charonlimit/charon/internal/gctune"
	"github.com/charonlimit/charon/internal/loadgen"
)

// Bench is `charon bench`: a closed-loop load of a running server
// (package loadgen), its throughput and latencies printed.
func Bench(args []string, stdout, stderr io.Writer) error {
	var o loadgen.Options
	fs := FlagSet("bench", stderr)
	fs.StringVar(&o.Addr, "addr", "localhost:8081", "server gRPC `HOST:PORT`")
	ct := clientTLS(fs)
	fs.IntVar(&o.Concurrency, "concurrency", 64, "requests in flight (closed loop)")
	fs.DurationVar(&o.Duration, "duration", 10*time.Second, "measured run time")
	fs.DurationVar(&o.Warmup, "warmup", time.Second, "unmeasured run time before it")
	fs.IntVar(&o.Conns, "conns", 2, "gRPC connections, used round robin by the workers")
	fs.StringVar(&o.Domain, "domain", "bench", "RLS domain")
	fs.StringVar(&o.Key, "key", "user", "descriptor entry key; values are k0..k(N-1)")
	fs.IntVar(&o.Descriptors, "descriptors", 1, "descriptors per request")
	fs.IntVar(&o.Keys, "keys", 10000, "distinct values, drawn uniformly")
	fs.BoolVar(&o.Hot, "hot", false, "one hot value instead of --keys")
	fs.BoolVar(&o.Three, "three", false, "three descriptors per request: {user}, {tenant} and {api, user}, users from --keys, tenants one per 100 users, 10 apis (--key and --descriptors are ignored)")
	fs.DurationVar(&o.Timeout, "timeout", 0, "each request's gRPC deadline (Envoy sends 20ms); 0: none")
	fs.BoolVar(&o.Noop, "noop", false, "call the gRPC health Check instead: the no-op ceiling")
	fs.BoolVar(&o.Reserve, "reserve", false, "a charon.v1 Reserve + Release pair of one copy per iteration, on one Session stream per worker (--domain/--key name a copy-limited resource)")
	fs.BoolVar(&o.Unary, "unary", false, "with --reserve: the pair as two unary calls instead of on a Session stream")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return err
		}
		return fmt.Errorf("%w: %v", ErrUsage, err)
	}
	transport, err := dialOption(ct)
	if err != nil {
		return err
	}
	o.Transport = transport
	if o.Noop && o.Reserve {
		return fmt.Errorf("%w: --noop and --reserve exclude each other", ErrUsage)
	}
	if o.Unary && !o.Reserve {
		return fmt.Errorf("%w: --unary needs --reserve", ErrUsage)
	}
	if o.Concurrency < 1 || o.Conns < 1 || o.Descriptors < 1 || o.Keys < 1 || o.Duration <= 0 {
		return fmt.Errorf("%w: --concurrency, --conns, --descriptors, --keys and --duration must be positive", ErrUsage)
	}
	// The load tool's own collections would take CPU from the server it
	// measures on a shared machine: the same heap floor as charon serve's.
	defer gctune.Floor(gctune.DefaultFloorMiB << 20).Stop()
	r, err := loadgen.Run(o)
	if err != nil {
		return err
	}
	mode := "ratelimit"
	switch {
	case o.Noop:
		mode = "noop"
	case o.Reserve && o.Unary:
		mode = "unary-reserve+release"
	case o.Reserve:
		mode = "reserve+release"
	}
	fmt.Fprintf(stdout, "mode=%s concurrency=%d duration=%s requests=%d errors=%d over_limit=%d rps=%.0f p50=%s p99=%s p99.9=%s\n",
		mode, o.Concurrency, r.Elapsed.Round(time.Millisecond), r.Requests, r.Errors, r.OverLimit, r.RPS(),
		r.P50.Round(time.Microsecond), r.P99.Round(time.Microsecond), r.P999.Round(time.Microsecond))
	if r.FirstError != nil {
		fmt.Fprintf(stdout, "first error: %v\n", r.FirstError)
	}
	return nil
}
