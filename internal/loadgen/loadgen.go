// Package loadgen is Charon's own load tool (`charon bench`): a closed loop
// of concurrent workers sending ShouldRateLimit, the gRPC health Check (the
// no-op ceiling) or charon.v1 Reserve + Release pairs to one server, timing
// every call. Client and server usually share a machine, so its figures are
// meant as ratios between runs of one session.
package loadgen

import (
	"context"
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
)

// Options drive a closed-loop load run: Concurrency workers each send
// one request, wait for the answer, and send the next, for Duration.
type Options struct {
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
	// Transport is the connections' transport credentials option; nil
	// means plaintext.
	Transport grpc.DialOption
	Noop      bool
	Reserve   bool
	Unary     bool
}

// Result is one run's outcome.
type Result struct {
	Requests, Errors, OverLimit int
	FirstError                  error
	Elapsed                     time.Duration
	P50, P99, P999              time.Duration
}

func (r Result) RPS() float64 { return float64(r.Requests) / r.Elapsed.Seconds() }

// Run runs o's load and returns what it measured.
func Run(o Options) (Result, error) {
	conns := make([]*grpc.ClientConn, o.Conns)
	for i := range conns {
		transport := o.Transport
		if transport == nil {
			transport = grpc.WithTransportCredentials(insecure.NewCredentials())
		}
		cc, err := grpc.NewClient(o.Addr, transport)
		if err != nil {
			return Result{}, err
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
		res       Result
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
