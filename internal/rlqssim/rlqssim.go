// Package rlqssim simulates Envoy rate_limit_quota filters against a real
// RLQS server: each simulated Envoy has its own request arrival rate over
// time, enforces its assigned token bucket locally as the filter does, and
// reports on a real stream every interval (per-bucket allowed and denied
// counts, whole-second elapsed times, the first report at 0). It measures
// the global allowed rate against the limit and each Envoy's share against
// its demand. `charon rlqs-sim` runs it; so do the tests.
//
// The filter's behaviour it follows: an assignment's TTL and fill interval
// are whole seconds; a token bucket starts full and refills continuously at
// tokens_per_fill per fill_interval, capped at max_tokens; a changed
// strategy starts a new, full bucket, the same one only extends the TTL; an
// expired or missing assignment allows everything (the default
// no_assignment and expired_assignment behaviour).
package rlqssim

import (
	"context"
	"fmt"
	"io"
	"math"
	"sync"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Options configure a run.
type Options struct {
	// Conns are the servers: Envoy i streams to Conns[i%len(Conns)].
	Conns  []grpc.ClientConnInterface
	Domain string
	Bucket map[string]string
	// Demands are the Envoys: each's request rate (per second) at an offset
	// from the start of the run.
	Demands []func(at time.Duration) float64
	// Interval is the reporting interval (whole seconds in Envoy); Step the
	// granularity of arrivals; Duration the run's length.
	Interval, Step, Duration time.Duration
}

// Second is one second of a run.
type Second struct {
	At      time.Duration
	Allowed int64 // over all Envoys
	// Per Envoy: requests arrived and allowed in the second, and the
	// assignment in force at its end (tokens per second; -1: none, allow all).
	Demand, Granted []int64
	Share           []float64
}

// Result is a run's record.
type Result struct{ Seconds []Second }

// envoy is one simulated filter.
type envoy struct {
	demand func(time.Duration) float64

	mu       sync.Mutex
	strategy proto.Message // the assignment's strategy; nil: none
	expires  time.Time
	deny     bool
	allowAll bool
	tokens   float64
	max      float64
	rate     float64 // tokens per second
	last     time.Time
	// counts since the last report, and in the current second
	allowed, denied     uint64
	secArrived, secOK   int64
	lastReport, started time.Time
	owed                float64
}

func (e *envoy) apply(r *rlqsv3.RateLimitQuotaResponse, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, a := range r.GetBucketAction() {
		if a.GetAbandonAction() != nil {
			e.strategy = nil
			continue
		}
		qa := a.GetQuotaAssignmentAction()
		ttl := time.Duration(qa.GetAssignmentTimeToLive().GetSeconds()) * time.Second // Envoy: whole seconds
		s := qa.GetRateLimitStrategy()
		e.expires = now.Add(ttl)
		if e.strategy != nil && proto.Equal(e.strategy, s) {
			continue // the same strategy: only the TTL moves
		}
		e.strategy = s
		e.deny = s.GetBlanketRule().String() == "DENY_ALL"
		e.allowAll = s.GetTokenBucket() == nil && !e.deny
		if tb := s.GetTokenBucket(); tb != nil {
			fill := time.Duration(tb.GetFillInterval().GetSeconds()) * time.Second
			e.max = float64(tb.GetMaxTokens())
			e.tokens = e.max // a new strategy starts full
			e.rate = float64(tb.GetTokensPerFill().GetValue()) / max(fill.Seconds(), 1)
			e.last = now
		}
	}
}

// admit decides one request at now.
func (e *envoy) admit(now time.Time) bool {
	if e.strategy == nil || !now.Before(e.expires) || e.allowAll {
		return true
	}
	if e.deny {
		return false
	}
	e.tokens = math.Min(e.max, e.tokens+now.Sub(e.last).Seconds()*e.rate)
	e.last = now
	if e.tokens >= 1 {
		e.tokens--
		return true
	}
	return false
}

// share is the assignment in force, in tokens per second (-1: none).
func (e *envoy) share(now time.Time) float64 {
	if e.strategy == nil || !now.Before(e.expires) || e.allowAll {
		return -1
	}
	if e.deny {
		return 0
	}
	return e.rate
}

// Run runs the simulation until Duration, writing a line per second to w
// (nil: none).
func Run(ctx context.Context, o Options, w io.Writer) (Result, error) {
	if len(o.Conns) == 0 {
		return Result{}, fmt.Errorf("rlqssim: no server")
	}
	o.Interval = max(o.Interval, time.Second)
	o.Step = cmpOr(o.Step, 5*time.Millisecond)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	envoys := make([]*envoy, len(o.Demands))
	streams := make([]grpc.BidiStreamingClient[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse], len(o.Demands))
	errc := make(chan error, len(o.Demands))
	var wg sync.WaitGroup
	for i, d := range o.Demands {
		e := &envoy{demand: d, started: start, lastReport: start}
		envoys[i] = e
		st, err := rlqsv3.NewRateLimitQuotaServiceClient(o.Conns[i%len(o.Conns)]).StreamRateLimitQuotas(ctx)
		if err != nil {
			return Result{}, err
		}
		streams[i] = st
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				r, err := st.Recv()
				if err != nil {
					if ctx.Err() == nil {
						errc <- err
					}
					return
				}
				e.apply(r, time.Now())
			}
		}()
	}
	defer wg.Wait()
	defer cancel()
	report := func(i int, elapsed time.Duration) error {
		e := envoys[i]
		e.mu.Lock()
		u := &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: &rlqsv3.BucketId{Bucket: o.Bucket},
			TimeElapsed: durationpb.New(elapsed.Truncate(time.Second)), NumRequestsAllowed: e.allowed, NumRequestsDenied: e.denied}
		e.allowed, e.denied = 0, 0
		e.mu.Unlock()
		return streams[i].Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: o.Domain, BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{u}})
	}
	// The filter reports a bucket at once when its first request creates
	// it, with an elapsed time of 0.
	for i := range envoys {
		if err := report(i, 0); err != nil {
			return Result{}, err
		}
	}
	var res Result
	step := time.NewTicker(o.Step)
	defer step.Stop()
	nextReport := start.Add(o.Interval)
	nextSecond := start.Add(time.Second)
	prev := start
	for {
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case err := <-errc:
			return res, fmt.Errorf("rlqssim: stream: %w", err)
		case now := <-step.C:
			dt := now.Sub(prev)
			prev = now
			at := now.Sub(start)
			for _, e := range envoys {
				e.mu.Lock()
				e.owed += e.demand(at) * dt.Seconds()
				for ; e.owed >= 1; e.owed-- {
					e.secArrived++
					if e.admit(now) {
						e.allowed++
						e.secOK++
					} else {
						e.denied++
					}
				}
				e.mu.Unlock()
			}
			if !now.Before(nextSecond) {
				sec := Second{At: nextSecond.Sub(start), Demand: make([]int64, len(envoys)), Granted: make([]int64, len(envoys)), Share: make([]float64, len(envoys))}
				for i, e := range envoys {
					e.mu.Lock()
					sec.Demand[i], sec.Granted[i], sec.Share[i] = e.secArrived, e.secOK, e.share(now)
					sec.Allowed += e.secOK
					e.secArrived, e.secOK = 0, 0
					e.mu.Unlock()
				}
				res.Seconds = append(res.Seconds, sec)
				if w != nil {
					fmt.Fprintf(w, "%4.0fs allowed %5d |", sec.At.Seconds(), sec.Allowed)
					for i := range envoys {
						fmt.Fprintf(w, " %d/%d@%.0f", sec.Granted[i], sec.Demand[i], sec.Share[i])
					}
					fmt.Fprintln(w)
				}
				nextSecond = nextSecond.Add(time.Second)
				if at >= o.Duration {
					return res, nil
				}
			}
			if !now.Before(nextReport) {
				for i := range envoys {
					if err := report(i, o.Interval); err != nil {
						return res, err
					}
				}
				nextReport = nextReport.Add(o.Interval)
			}
		}
	}
}

func cmpOr(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// WorstWindow is the largest relative error of the allowed total over any
// window of n seconds from second from on, against limit per second.
func (r Result) WorstWindow(limit float64, from, n int) float64 {
	worst := 0.0
	for i := from; i+n <= len(r.Seconds); i++ {
		var sum int64
		for _, s := range r.Seconds[i : i+n] {
			sum += s.Allowed
		}
		worst = math.Max(worst, math.Abs(float64(sum)/(limit*float64(n))-1))
	}
	return worst
}

// FairShares are the max-min fair shares of limit among demands.
func FairShares(limit float64, demands []float64) []float64 {
	out := make([]float64, len(demands))
	left := limit
	idx := make([]int, len(demands))
	for i := range idx {
		idx[i] = i
	}
	for len(idx) > 0 {
		each := left / float64(len(idx))
		var rest []int
		done := false
		for _, i := range idx {
			if demands[i] <= each {
				out[i] = demands[i]
				left -= demands[i]
				done = true
			} else {
				rest = append(rest, i)
			}
		}
		if !done {
			for _, i := range rest {
				out[i] = each
			}
			break
		}
		idx = rest
	}
	return out
}
