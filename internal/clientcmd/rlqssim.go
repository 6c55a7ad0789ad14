package clientcmd

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/rlqssim"
)

// RLQSSim is `charon rlqs-sim`: simulated Envoy rate_limit_quota filters
// against a running server's RLQS, as Envoy's filter behaves (reports every
// 5 s, whole seconds elapsed, random arrivals), one line per second
// (allowed in total; per Envoy allowed/arrived@share per second), then a
// summary of the seconds after --settle: each Envoy's part of its requests
// allowed, the allowed total against the limit, which it reads from the
// server's debug port (GET /rlqs), and the assignments sent.
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
	duration := fs.Duration("duration", 60*time.Second, "length of the run")
	interval := fs.Duration("interval", rlqssim.EnvoyInterval, "how often each Envoy reports (whole seconds; Envoy's filter: 5s whatever its reporting_interval says)")
	arrivals := fs.String("arrivals", "poisson", "how requests arrive: poisson (independent clients) or uniform (one every 1/rate s)")
	spread := fs.Bool("spread", true, "start the Envoys (their first requests and report timers) at instants spread over the first interval, not all at once")
	seed := fs.Uint64("seed", 1, "seed of the Poisson arrivals")
	settle := fs.Duration("settle", 15*time.Second, "the summary is of the seconds after this")
	limit := fs.Float64("limit", 0, "the rule's limit per second (0: read from the server's debug port; refused if it differs from the server's)")
	debugAddr := fs.String("debug-addr", "localhost:6070", "the server's debug port `HOST:PORT`, to read the limit from (over TLS with --tls)")
	tokenFile := fs.String("debug-token-file", "", "`file` of the debug port's bearer token (serve --debug-token-file)")
	if err := ParseFlags(fs, args); err != nil {
		return err
	}
	es, err := descriptors.ParseDescriptor(*bucket)
	if err != nil || *domain == "" || *envoys < 1 || *duration < time.Second {
		return fmt.Errorf("%w: rlqs-sim needs --domain, --bucket k=v, --envoys >= 1 and --duration >= 1s", ErrUsage)
	}
	if *interval < time.Second || *interval%time.Second != 0 {
		return fmt.Errorf("%w: --interval %v: want whole seconds, at least 1s", ErrUsage, *interval)
	}
	kinds := map[string]rlqssim.Arrivals{"poisson": rlqssim.Poisson, "uniform": rlqssim.Uniform}
	kind, ok := kinds[*arrivals]
	if !ok {
		return fmt.Errorf("%w: --arrivals %q: want poisson or uniform", ErrUsage, *arrivals)
	}
	id := map[string]string{}
	for _, e := range es {
		id[e.Key] = e.Value
	}
	perSecond, err := serverLimit(&c, *debugAddr, *tokenFile, *domain, *bucket, *limit, stderr)
	if err != nil {
		return err
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
		Interval: *interval, Duration: *duration, Arrivals: kind, Seed: *seed, Spread: *spread}, stdout)
	if err != nil {
		return err
	}
	printSimSummary(stdout, res, int(*settle/time.Second), perSecond, demands)
	return nil
}

// serverLimit is the limit per second of the run's summary: the server's
// for the bucket, read from its debug port; given (given > 0), it must be
// the server's, or the summary would measure the run against a limit the
// server does not enforce. When the debug port cannot be read, a given
// limit is used unchecked (said on stderr), and none means no summary
// against a limit.
func serverLimit(c *connFlags, addr, tokenFile, domain, bucket string, given float64, stderr io.Writer) (float64, error) {
	var token string
	if tokenFile != "" {
		b, err := os.ReadFile(tokenFile)
		if err != nil {
			return 0, fmt.Errorf("%w: --debug-token-file: %v", ErrUsage, err)
		}
		token = strings.TrimSpace(string(b))
	}
	cfg, err := c.tls.Config()
	if err != nil {
		return 0, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	scheme, hc := "http", &http.Client{Timeout: c.timeout}
	if cfg != nil {
		scheme = "https"
		hc.Transport = &http.Transport{TLSClientConfig: cfg}
	}
	u := scheme + "://" + addr + "/rlqs?" + url.Values{"domain": {domain}, "bucket": {bucket}}.Encode()
	var x struct {
		Rule, Fallback, Fill string
		Limit                int64
	}
	err = getJSON(hc, u, token, &x)
	var perSecond float64
	if err == nil && x.Rule != "" {
		// Limit tokens per Fill (a limit per second is split in tokens per
		// 10 s; servers before that said per 1 s).
		var fill time.Duration
		if fill, err = time.ParseDuration(x.Fill); err == nil && fill > 0 {
			perSecond = float64(x.Limit) / fill.Seconds()
		} else {
			err = fmt.Errorf("%s: a limit of %d per %q", u, x.Limit, x.Fill)
		}
	}
	if err != nil {
		if given > 0 {
			fmt.Fprintf(stderr, "charon rlqs-sim: cannot read the server's limit (%v); the summary uses --limit %v unchecked\n", err, given)
			return given, nil
		}
		fmt.Fprintf(stderr, "charon rlqs-sim: cannot read the server's limit (%v); no summary against a limit (give --debug-addr, or --limit)\n", err)
		return 0, nil
	}
	switch {
	case x.Rule == "" && given > 0:
		return 0, fmt.Errorf("%w: --limit %v: the server limits no rule for %s %s (it answers %s)", ErrUsage, given, domain, bucket, x.Fallback)
	case x.Rule == "":
		fmt.Fprintf(stderr, "charon rlqs-sim: the server limits no rule for %s %s (it answers %s)\n", domain, bucket, x.Fallback)
		return 0, nil
	case given > 0 && math.Abs(given-perSecond) > 1e-9*perSecond:
		return 0, fmt.Errorf("%w: --limit %v differs from the server's limit for %s %s, %v per second (rule %s): leave --limit out to use the server's",
			ErrUsage, given, domain, bucket, perSecond, x.Rule)
	}
	return perSecond, nil
}

// getJSON decodes the JSON answer to a GET of u.
func getJSON(hc *http.Client, u, token string, out any) error {
	req, err := http.NewRequest("GET", u, nil)
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%s: %s: %s", u, resp.Status, strings.TrimSpace(string(b)))
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s: %v", u, err)
	}
	return nil
}

// extremes returns the indices of the least and the largest of v.
func extremes(v []float64) (lo, hi int) {
	for i, x := range v {
		if x < v[lo] {
			lo = i
		}
		if x > v[hi] {
			hi = i
		}
	}
	return lo, hi
}

// printSimSummary prints the summary of the seconds of res from second
// from on (from the second second when the run is shorter): against limit
// per second when known (> 0).
func printSimSummary(w io.Writer, res rlqssim.Result, from int, limit float64, demands []func(time.Duration) float64) {
	if from >= len(res.Seconds) {
		from = min(1, len(res.Seconds)-1)
	}
	served, allowed := res.Served(from)
	news, renewed := res.Assignments(from)
	fmt.Fprintf(w, "after %d s:\n", from)
	if limit > 0 {
		fmt.Fprintf(w, "  allowed %.1f per second of the limit %v (%.1f%%)", allowed, limit, 100*allowed/limit)
		if n := len(res.Seconds) - from; n >= 10 {
			over, under := res.Windows(limit, from, 10)
			fmt.Fprintf(w, "; 10 s windows at most %.1f%% over, %.1f%% under", 100*over, 100*under)
		}
		fmt.Fprintln(w)
	} else {
		fmt.Fprintf(w, "  allowed %.1f per second\n", allowed)
	}
	if limit <= 0 {
		lo, hi := extremes(served)
		fmt.Fprintf(w, "  each Envoy allowed %.1f%% (Envoy %d) to %.1f%% (Envoy %d) of its requests\n", 100*served[lo], lo, 100*served[hi], hi)
	}
	if limit > 0 {
		// Second by second, by the Envoys' rates: those whose fair share of
		// the limit meets their rate are owed all their requests; the
		// others, their fair share.
		n := len(demands)
		arrived, okAll, fair, okFair := make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
		d := make([]float64, n)
		for _, s := range res.Seconds[from:] {
			for j, g := range demands {
				d[j] = g(s.At - time.Millisecond)
			}
			for j, f := range rlqssim.FairShares(limit, d) {
				if d[j] <= f {
					arrived[j] += float64(s.Demand[j])
					okAll[j] += float64(s.Granted[j])
				} else {
					fair[j] += f
					okFair[j] += float64(s.Granted[j])
				}
			}
		}
		group := func(what string, ok, of []float64) {
			var idx []int
			var r []float64
			for j := range ok {
				if of[j] > 0 {
					idx, r = append(idx, j), append(r, ok[j]/of[j])
				}
			}
			if len(r) > 0 {
				lo, hi := extremes(r)
				fmt.Fprintf(w, "  Envoys owed %s: %.1f%% (Envoy %d) to %.1f%% (Envoy %d) of it allowed\n", what, 100*r[lo], idx[lo], 100*r[hi], idx[hi])
			}
		}
		group("all their requests", okAll, arrived)
		group("their fair share of the limit", okFair, fair)
		if at := res.Settled(0, limit, demands, 0.15); at >= 0 {
			fmt.Fprintf(w, "  every share within 15%% of its fair share, or above, from %v\n", res.Seconds[at].At)
		}
	}
	fmt.Fprintf(w, "  assignments: %d new strategies (each a new, full token bucket), %d renewals\n", news, renewed)
}
