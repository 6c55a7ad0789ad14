package clientcmd

import (
	"context"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/rlqssim"
)

// RLQSSim is `charon rlqs-sim`: simulated Envoy rate_limit_quota filters
// against a running server's RLQS, one line per second (allowed in total;
// per Envoy allowed/arrived@share per second), then the worst 10 s window
// against --limit.
func RLQSSim(args []string, stdout, stderr io.Writer) error {
	var c connFlags
	fs := FlagSet("rlqs-sim", stderr)
	c.declare(fs, "localhost:8081", 5*time.Second)
	domain := fs.String("domain", "", "RLS domain of the reports")
	bucket := fs.String("bucket", "", "bucket id `k=v,k2=v2`")
	envoys := fs.Int("envoys", 20, "simulated Envoys")
	rate := fs.Float64("rate", 40, "requests per second of each Envoy")
	skew := fs.Float64("skew", 10, "the heavy Envoy's rate, a multiple of --rate")
	shift := fs.Duration("shift", 0, "after this long the next Envoy becomes the heavy one (0: never)")
	duration := fs.Duration("duration", 30*time.Second, "length of the run")
	interval := fs.Duration("interval", time.Second, "reporting interval (whole seconds)")
	limit := fs.Float64("limit", 0, "the rule's limit per second, for the summary (0: no summary)")
	if err := ParseFlags(fs, args); err != nil {
		return err
	}
	es, err := descriptors.ParseDescriptor(*bucket)
	if err != nil || *domain == "" || *envoys < 1 || *duration < time.Second {
		return fmt.Errorf("%w: rlqs-sim needs --domain, --bucket k=v, --envoys >= 1 and --duration >= 1s", ErrUsage)
	}
	id := map[string]string{}
	for _, e := range es {
		id[e.Key] = e.Value
	}
	demands := make([]func(time.Duration) float64, *envoys)
	for i := range demands {
		demands[i] = func(at time.Duration) float64 {
			heavy := 0
			if *shift > 0 {
				heavy = int(at / *shift) % *envoys
			}
			if i == heavy {
				return *rate * *skew
			}
			return *rate
		}
	}
	cc, err := c.dial()
	if err != nil {
		return err
	}
	defer cc.Close()
	fmt.Fprintln(stdout, "# second, allowed in total | per Envoy: allowed/arrived@share (tokens per second; -1: no assignment)")
	res, err := rlqssim.Run(context.Background(), rlqssim.Options{Conns: []grpc.ClientConnInterface{cc}, Domain: *domain, Bucket: id, Demands: demands,
		Interval: *interval, Duration: *duration}, stdout)
	if err != nil {
		return err
	}
	if *limit > 0 && len(res.Seconds) > 10 {
		fmt.Fprintf(stdout, "worst 10 s window after the first second: %.1f%% off %.0f per second\n", 100*res.WorstWindow(*limit, 1, 10), *limit)
	}
	return nil
}
