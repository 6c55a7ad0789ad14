package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/charonlimit/charon/internal/gctune"
)

// benchOptions drive a closed-loop load run: Concurrency workers each send
// one request, wait for the answer, and send the next, for Duration.
type benchOptions struct {
	Addr        string
	Concurrency int
	Duration    time.Duration
	Warmup      time.Duration
	Conns       int
	Domain      string
	Key         string
	Descriptors int
	Keys        int
	Hot         bool
	Three       bool
	Timeout     time.Duration
	Noop        bool
	Reserve     bool
	Unary       bool
}

// benchResult is one run's outcome.
type benchResult struct {
	Requests, Errors, OverLimit int
	FirstError                  error
	Elapsed                     time.Duration
	P50, P99, P999              time.Duration
}

func (r benchResult) RPS() float64 { return float64(r.Requests) / r.Elapsed.Seconds() }

func runBench(args []string, stdout, stderr io.Writer) error {
	var o benchOptions
	fs := flag.NewFlagSet("charon bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.Addr, "addr", "localhost:8081", "server gRPC `HOST:PORT`")
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
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if o.Noop && o.Reserve {
		return fmt.Errorf("%w: --noop and --reserve exclude each other", errUsage)
	}
	if o.Unary && !o.Reserve {
		return fmt.Errorf("%w: --unary needs --reserve", errUsage)
	}
	if o.Concurrency < 1 || o.Conns < 1 || o.Descriptors < 1 || o.Keys < 1 || o.Duration <= 0 {
		return fmt.Errorf("%w: --concurrency, --conns, --descriptors, --keys and --duration must be positive", errUsage)
	}
	// The load tool's own collections would take CPU from the server it
	// measures on a shared machine: the same heap floor as charon serve's.
	defer gctune.Floor(defaultHeapFloorMiB << 20).Stop()
	r, err := bench(o)
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

func bench(o benchOptions) (benchResult, error) {
	conns := make([]*grpc.ClientConn, o.Conns)
	for i := range conns {
		cc, err := grpc.NewClient(o.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return benchResult{}, err
		}
		defer cc.Close()
		conns[i] = cc
	}
	values := make([]string, o.Keys)
	for i := range values {
		values[i] = "k" + strconv.Itoa(i)
	}

	var (
		mu        sync.Mutex
		latencies []time.Duration
		res       benchResult
		wg        sync.WaitGroup
		measuring = make(chan struct{})
	)
	// The end is checked against the clock, not a context deadline: gRPC's
	// own deadline timer may fire before the context reports it, and calls
	// cut at the end must not count as errors.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	end := time.Now().Add(o.Warmup + o.Duration)
	for w := 0; w < o.Concurrency; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			cc := conns[w%len(conns)]
			rl := rlsv3.NewRateLimitServiceClient(cc)
			hc := healthpb.NewHealthClient(cc)
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			req := &rlsv3.RateLimitRequest{Domain: o.Domain}
			for i := 0; i < o.Descriptors && !o.Three; i++ {
				req.Descriptors = append(req.Descriptors, &ratelimitv3.RateLimitDescriptor{
					Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: o.Key}},
				})
			}
			entry := func(k string) *ratelimitv3.RateLimitDescriptor_Entry {
				return &ratelimitv3.RateLimitDescriptor_Entry{Key: k}
			}
			var user, tenant, api, apiUser *ratelimitv3.RateLimitDescriptor_Entry
			if o.Three {
				user, tenant, api, apiUser = entry("user"), entry("tenant"), entry("api"), entry("user")
				req.Descriptors = []*ratelimitv3.RateLimitDescriptor{
					{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{user}},
					{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{tenant}},
					{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{api, apiUser}},
				}
			}
			hreq := &healthpb.HealthCheckRequest{}
			var pair *reservePair
			if o.Reserve {
				p, err := newReservePair(ctx, cc, o.Domain, o.Key, o.Unary)
				if err != nil {
					mu.Lock()
					res.Errors++
					if res.FirstError == nil {
						res.FirstError = err
					}
					mu.Unlock()
					return
				}
				pair = p
			}
			lat := make([]time.Duration, 0, 1<<14)
			var n, errs, over int
			var firstErr error
			measured := false
			for time.Now().Before(end) {
				if !measured {
					select {
					case <-measuring:
						measured = true
						lat, n, errs, over = lat[:0], 0, 0, 0
					default:
					}
				}
				switch {
				case o.Three:
					u := rng.IntN(len(values))
					user.Value, apiUser.Value = values[u], values[u]
					tenant.Value = values[u/100]
					api.Value = values[rng.IntN(min(10, len(values)))]
				default:
					for _, d := range req.Descriptors {
						if o.Hot {
							d.Entries[0].Value = "hot"
						} else {
							d.Entries[0].Value = values[rng.IntN(len(values))]
						}
					}
				}
				start := time.Now()
				var err error
				switch {
				case o.Noop:
					_, err = hc.Check(ctx, hreq)
				case o.Reserve:
					var ok bool
					ok, err = pair.do(req.Descriptors[0].Entries[0].Value)
					if err == nil && !ok {
						over++
					}
				default:
					var resp *rlsv3.RateLimitResponse
					cctx, ccancel := ctx, context.CancelFunc(func() {})
					if o.Timeout > 0 {
						cctx, ccancel = context.WithTimeout(ctx, o.Timeout)
					}
					resp, err = rl.ShouldRateLimit(cctx, req)
					ccancel()
					if err == nil && resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
						over++
					}
				}
				if time.Now().After(end) {
					break // the run ended during this call: not counted
				}
				lat = append(lat, time.Since(start))
				n++
				if err != nil {
					errs++
					if firstErr == nil {
						firstErr = err
					}
				}
			}
			if !measured {
				return
			}
			mu.Lock()
			latencies = append(latencies, lat...)
			res.Requests += n
			res.Errors += errs
			res.OverLimit += over
			if res.FirstError == nil {
				res.FirstError = firstErr
			}
			mu.Unlock()
		}(w)
	}
	time.Sleep(o.Warmup)
	close(measuring)
	start := time.Now()
	wg.Wait()
	res.Elapsed = time.Since(start)
	slices.Sort(latencies)
	res.P50, res.P99, res.P999 = quantile(latencies, 0.50), quantile(latencies, 0.99), quantile(latencies, 0.999)
	return res, nil
}

// quantile returns the q-quantile of sorted (nearest rank).
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}
