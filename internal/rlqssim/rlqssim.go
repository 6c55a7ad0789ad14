// Package rlqssim simulates Envoy rate_limit_quota filters against an RLQS
// server: each simulated Envoy has its own request arrival rate over time,
// enforces its assigned token bucket locally as the filter does, and
// reports its usage as the filter does. It measures the global allowed
// rate against the limit, each Envoy's share against its demand, and how
// many assignments were new strategies rather than renewals. `charon
// rlqs-sim` runs it against a server in real time (Run); the tests also run
// it on a virtual clock against servers in the same process (Simulate).
//
// The filter's behaviour it follows: a bucket is created by its first
// request, which is reported at once with an elapsed time of 0; then the
// filter reports every EnvoyInterval (5 s, whatever the bucket's
// reporting_interval says), its elapsed time the whole seconds since the
// bucket's last report, truncated. An assignment's TTL and fill interval are
// read as whole seconds; a token bucket starts full and refills
// continuously at tokens_per_fill per fill_interval, capped at max_tokens;
// a changed strategy starts a new, full bucket, the same one only extends
// the TTL; an expired or missing assignment allows everything (the default
// no_assignment and expired_assignment behaviour).
package rlqssim

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
)

// EnvoyInterval is how often Envoy's rate_limit_quota filter reports its
// buckets' usage, whatever their reporting_interval says.
const EnvoyInterval = 5 * time.Second

// Arrivals is how requests arrive at a simulated Envoy.
type Arrivals uint8

// Arrival processes.
const (
	// Poisson arrivals: independent requests at the demand's rate, as many
	// clients make; their counts over a second vary by the square root of
	// the rate.
	Poisson Arrivals = iota
	// Uniform arrivals: one request every 1/rate seconds.
	Uniform
)

// Options configure a run.
type Options struct {
	// Conns are the servers of Run: Envoy i streams to Conns[i%len(Conns)].
	Conns  []grpc.ClientConnInterface
	Domain string
	Bucket map[string]string
	// Demands are the Envoys: each's request rate (per second) at an offset
	// from the start of the run.
	Demands []func(at time.Duration) float64
	// Interval is the period of each Envoy's reports (0: EnvoyInterval),
	// Step the granularity of arrivals (0: 5 ms), Duration the run's length.
	Interval, Step, Duration time.Duration
	// Arrivals is the arrival process; Seed seeds the Poisson arrivals.
	Arrivals Arrivals
	Seed     uint64
	// Spread starts Envoy i at i/n of the first interval rather than all at
	// once: Envoys whose first requests (and so their report timers) come
	// at different instants, as independent proxies' do.
	Spread bool
}

// Second is one second of a run.
type Second struct {
	At      time.Duration
	Allowed int64 // over all Envoys
	// Per Envoy: requests arrived and allowed in the second, and the
	// assignment in force at its end (tokens per second; -1: none, allow all).
	Demand, Granted []int64
	Share           []float64
	// New and Renewed count the assignments applied in the second that
	// were new strategies, and those that only extended a TTL.
	New, Renewed int
}

// Result is a run's record.
type Result struct {
	Seconds []Second
	// New counts the assignments that were a new strategy for their Envoy
	// (a new, full token bucket), Renewed those that only extended a TTL,
	// over all Envoys.
	New, Renewed int
}

// Blanket is a blanket rule of an Assignment.
type Blanket uint8

// Blanket rules.
const (
	NoBlanket Blanket = iota
	AllowAll
	DenyAll
)

// Assignment is one bucket action of a response, as the filter reads it.
type Assignment struct {
	Bucket map[string]string
	// Abandon: forget the bucket's assignment.
	Abandon bool
	// Blanket, or else a token bucket of TokensPerFill per Fill (whole
	// seconds) holding at most MaxTokens.
	Blanket                  Blanket
	MaxTokens, TokensPerFill int64
	Fill                     time.Duration
	TTL                      time.Duration // whole seconds
}

// strategy is the part of an assignment that the filter compares to decide
// whether it is a new one.
func (a Assignment) strategy() [4]int64 {
	return [4]int64{int64(a.Blanket), a.MaxTokens, a.TokensPerFill, int64(a.Fill)}
}

// Usage is one report of one bucket.
type Usage struct {
	Bucket          map[string]string
	Elapsed         time.Duration
	Allowed, Denied uint64
}

// envoy is one simulated filter.
type envoy struct {
	demand func(time.Duration) float64
	start  time.Duration // its first request, from the start of the run
	rng    *rand.Rand

	mu       sync.Mutex
	has      bool // an assignment in force (until expires)
	strategy [4]int64
	expires  time.Time
	deny     bool
	allowAll bool
	tokens   float64
	max      float64
	rate     float64 // tokens per second
	last     time.Time
	// counts since the last report, and in the current second
	allowed, denied    uint64
	secArrived, secOK  int64
	secNew, secRenewed int
	created            bool
	lastReport         time.Time
	nextReport         time.Duration
	owed               float64
	news, renewals     int
}

// apply takes the assignments of one response at now.
func (e *envoy) apply(as []Assignment, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, a := range as {
		if a.Abandon {
			e.has = false
			continue
		}
		e.expires = now.Add(a.TTL.Truncate(time.Second)) // Envoy: whole seconds
		if e.has && e.strategy == a.strategy() {
			e.renewals++
			e.secRenewed++
			continue // the same strategy: only the TTL moves
		}
		e.news++
		e.secNew++
		e.has, e.strategy = true, a.strategy()
		e.deny = a.Blanket == DenyAll
		e.allowAll = a.Blanket == AllowAll
		if a.Blanket == NoBlanket {
			fill := a.Fill.Truncate(time.Second)
			e.max = float64(a.MaxTokens)
			e.tokens = e.max // a new strategy starts full
			e.rate = float64(a.TokensPerFill) / max(fill.Seconds(), 1)
			e.last = now
		}
	}
}

// admit decides one request at now.
func (e *envoy) admit(now time.Time) bool {
	if !e.has || !now.Before(e.expires) || e.allowAll {
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
	if !e.has || !now.Before(e.expires) || e.allowAll {
		return -1
	}
	if e.deny {
		return 0
	}
	return e.rate
}

// request decides one arrival at now and counts it.
func (e *envoy) request(now time.Time) {
	e.secArrived++
	if e.admit(now) {
		e.allowed++
		e.secOK++
	} else {
		e.denied++
	}
}

// arrivals is the number of requests arriving at rate per second over dt.
func (e *envoy) arrivals(kind Arrivals, rate float64, dt time.Duration) int {
	mean := rate * dt.Seconds()
	if kind == Uniform {
		e.owed += mean
		n := int(e.owed)
		e.owed -= float64(n)
		return n
	}
	// Poisson, by inversion: mean is small at a step of milliseconds.
	n, p := 0, math.Exp(-mean)
	cdf, u := p, e.rng.Float64()
	for u > cdf && n < 1<<20 {
		n++
		p *= mean / float64(n)
		cdf += p
	}
	return n
}

// usage takes the counts since the last report at now, as the filter
// reports them.
func (e *envoy) usage(bucket map[string]string, now time.Time) Usage {
	u := Usage{Bucket: bucket, Elapsed: now.Sub(e.lastReport).Truncate(time.Second), Allowed: e.allowed, Denied: e.denied}
	e.allowed, e.denied = 0, 0
	e.lastReport = now
	return u
}

// sim is a run's clockwork, whatever its clock and transport.
type sim struct {
	o       Options
	envoys  []*envoy
	start   time.Time
	res     Result
	w       io.Writer
	nextSec time.Duration
}

func newSim(o Options, start time.Time, w io.Writer) (*sim, error) {
	if len(o.Demands) == 0 {
		return nil, fmt.Errorf("rlqssim: no Envoys")
	}
	o.Interval = max(cmpOr(o.Interval, EnvoyInterval), time.Second)
	o.Step = cmpOr(o.Step, 5*time.Millisecond)
	s := &sim{o: o, start: start, w: w, nextSec: time.Second}
	for i, d := range o.Demands {
		e := &envoy{demand: d, rng: rand.New(rand.NewPCG(o.Seed, uint64(i)))}
		if o.Spread {
			e.start = (o.Interval * time.Duration(i) / time.Duration(len(o.Demands))).Truncate(o.Step)
		}
		s.envoys = append(s.envoys, e)
	}
	return s, nil
}

// step runs the Envoys from now-dt to now: their arrivals, their reports
// due (send: Envoy i reports u), and the second that ends, if one does. It
// reports whether the run is over.
func (s *sim) step(now time.Time, dt time.Duration, send func(i int, u Usage) error) (done bool, err error) {
	at := now.Sub(s.start)
	for i, e := range s.envoys {
		e.mu.Lock()
		var u *Usage
		switch {
		case at < e.start:
		case !e.created:
			// The first request creates the bucket and is reported at
			// once, with no elapsed time; the report timer starts.
			e.created, e.lastReport, e.nextReport = true, now, at+s.o.Interval
			e.request(now)
			v := e.usage(s.o.Bucket, now)
			u = &v
		default:
			for range e.arrivals(s.o.Arrivals, e.demand(at), dt) {
				e.request(now)
			}
			if at >= e.nextReport {
				// Envoy arms its timer again once it has sent the reports:
				// the next comes an interval after this one, never sooner.
				v := e.usage(s.o.Bucket, now)
				u = &v
				e.nextReport = at + s.o.Interval
			}
		}
		e.mu.Unlock()
		if u != nil {
			if err := send(i, *u); err != nil {
				return true, err
			}
		}
	}
	if at < s.nextSec {
		return false, nil
	}
	sec := Second{At: s.nextSec, Demand: make([]int64, len(s.envoys)), Granted: make([]int64, len(s.envoys)), Share: make([]float64, len(s.envoys))}
	for i, e := range s.envoys {
		e.mu.Lock()
		sec.Demand[i], sec.Granted[i], sec.Share[i] = e.secArrived, e.secOK, e.share(now)
		sec.Allowed += e.secOK
		sec.New += e.secNew
		sec.Renewed += e.secRenewed
		e.secArrived, e.secOK, e.secNew, e.secRenewed = 0, 0, 0, 0
		e.mu.Unlock()
	}
	s.res.Seconds = append(s.res.Seconds, sec)
	if s.w != nil {
		fmt.Fprintf(s.w, "%4.0fs allowed %5d |", sec.At.Seconds(), sec.Allowed)
		for i := range s.envoys {
			fmt.Fprintf(s.w, " %d/%d@%.0f", sec.Granted[i], sec.Demand[i], sec.Share[i])
		}
		fmt.Fprintln(s.w)
	}
	s.nextSec += time.Second
	return at >= s.o.Duration, nil
}

// result is the run's record so far.
func (s *sim) result() Result {
	r := s.res
	for _, e := range s.envoys {
		e.mu.Lock()
		r.New += e.news
		r.Renewed += e.renewals
		e.mu.Unlock()
	}
	return r
}

// Run runs the simulation against o.Conns in real time until Duration,
// writing a line per second to w (nil: none).
func Run(ctx context.Context, o Options, w io.Writer) (Result, error) {
	if len(o.Conns) == 0 {
		return Result{}, fmt.Errorf("rlqssim: no server")
	}
	s, err := newSim(o, time.Now(), w)
	if err != nil {
		return Result{}, err
	}
	o = s.o
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	streams := make([]grpc.BidiStreamingClient[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse], len(o.Demands))
	errc := make(chan error, len(o.Demands))
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for i, e := range s.envoys {
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
				e.apply(FromProto(r), time.Now())
			}
		}()
	}
	send := func(i int, u Usage) error {
		return streams[i].Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: o.Domain,
			BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
				BucketId: &rlqsv3.BucketId{Bucket: u.Bucket}, TimeElapsed: durationpb.New(u.Elapsed),
				NumRequestsAllowed: u.Allowed, NumRequestsDenied: u.Denied}}})
	}
	tick := time.NewTicker(o.Step)
	defer tick.Stop()
	prev := s.start
	for {
		select {
		case <-ctx.Done():
			return s.result(), ctx.Err()
		case err := <-errc:
			return s.result(), fmt.Errorf("rlqssim: stream: %w", err)
		case now := <-tick.C:
			done, err := s.step(now, now.Sub(prev), send)
			prev = now
			if err != nil || done {
				return s.result(), err
			}
		}
	}
}

// FromProto is the filter's reading of a response.
func FromProto(r *rlqsv3.RateLimitQuotaResponse) []Assignment {
	var out []Assignment
	for _, a := range r.GetBucketAction() {
		as := Assignment{Bucket: a.GetBucketId().GetBucket()}
		if a.GetAbandonAction() != nil {
			as.Abandon = true
			out = append(out, as)
			continue
		}
		qa := a.GetQuotaAssignmentAction()
		as.TTL = time.Duration(qa.GetAssignmentTimeToLive().GetSeconds()) * time.Second
		s := qa.GetRateLimitStrategy()
		if tb := s.GetTokenBucket(); tb != nil {
			as.MaxTokens, as.TokensPerFill = int64(tb.GetMaxTokens()), int64(tb.GetTokensPerFill().GetValue())
			as.Fill = time.Duration(tb.GetFillInterval().GetSeconds()) * time.Second
		} else if s.GetBlanketRule() == typev3.RateLimitStrategy_DENY_ALL {
			as.Blanket = DenyAll
		} else {
			as.Blanket = AllowAll
		}
		out = append(out, as)
	}
	return out
}

// Server is an RLQS server in the process of a virtual-time run
// (Simulate), whose clock the run sets.
type Server interface {
	// Advance moves the server's clock to now and runs what is due by
	// then (its ticks, its flushes).
	Advance(ctx context.Context, now time.Time)
	// Open opens one Envoy's stream.
	Open() Stream
}

// Stream is one Envoy's stream on a Server.
type Stream interface {
	Report(ctx context.Context, domain string, usages []Usage) error
	// Pending returns the assignments sent since its last call.
	Pending() []Assignment
}

// Simulate runs the simulation on a virtual clock, from start, against
// servers in the process (Envoy i streams to servers[i%len(servers)]):
// arrivals, reports, the servers' ticks and their answers all happen at
// the instants of the run, however busy the machine is, and a seed gives
// the same run every time. Responses arrive within the step they are sent.
func Simulate(ctx context.Context, o Options, start time.Time, servers []Server, w io.Writer) (Result, error) {
	if len(servers) == 0 {
		return Result{}, fmt.Errorf("rlqssim: no server")
	}
	s, err := newSim(o, start, w)
	if err != nil {
		return Result{}, err
	}
	streams := make([]Stream, len(s.envoys))
	for i := range streams {
		streams[i] = servers[i%len(servers)].Open()
	}
	deliver := func(now time.Time) {
		for i, st := range streams {
			if as := st.Pending(); len(as) > 0 {
				s.envoys[i].apply(as, now)
			}
		}
	}
	send := func(i int, u Usage) error { return streams[i].Report(ctx, s.o.Domain, []Usage{u}) }
	for now := start.Add(s.o.Step); ; now = now.Add(s.o.Step) {
		if err := ctx.Err(); err != nil {
			return s.result(), err
		}
		for _, srv := range servers {
			srv.Advance(ctx, now)
		}
		deliver(now)
		done, err := s.step(now, s.o.Step, send)
		deliver(now)
		if err != nil || done {
			return s.result(), err
		}
	}
}

func cmpOr(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// Windows returns, over every window of n seconds from second from on,
// the largest excess and the largest shortfall of the allowed total
// against limit per second, as fractions of the limit (0: none).
func (r Result) Windows(limit float64, from, n int) (over, under float64) {
	for i := from; i+n <= len(r.Seconds); i++ {
		var sum int64
		for _, s := range r.Seconds[i : i+n] {
			sum += s.Allowed
		}
		d := float64(sum)/(limit*float64(n)) - 1
		over, under = math.Max(over, d), math.Max(under, -d)
	}
	return over, under
}

// Assignments counts the new and the renewed assignments applied from
// second from on.
func (r Result) Assignments(from int) (news, renewed int) {
	for _, s := range r.Seconds[min(from, len(r.Seconds)):] {
		news += s.New
		renewed += s.Renewed
	}
	return news, renewed
}

// Served returns, over the seconds from second from on, each Envoy's
// allowed requests as a fraction of those that arrived (1 when none did),
// and the allowed total per second.
func (r Result) Served(from int) (fraction []float64, allowed float64) {
	if from >= len(r.Seconds) {
		return nil, 0
	}
	n := len(r.Seconds[from].Demand)
	arrived, granted := make([]int64, n), make([]int64, n)
	var total int64
	for _, s := range r.Seconds[from:] {
		for i := range n {
			arrived[i] += s.Demand[i]
			granted[i] += s.Granted[i]
		}
		total += s.Allowed
	}
	fraction = make([]float64, n)
	for i := range n {
		fraction[i] = 1
		if arrived[i] > 0 {
			fraction[i] = float64(granted[i]) / float64(arrived[i])
		}
	}
	return fraction, float64(total) / float64(len(r.Seconds)-from)
}

// Settled returns the first second at or after from at whose end every
// Envoy's share was at least its max-min fair share of limit, by the
// demands of that second, less tolerance (a fraction); or -1.
func (r Result) Settled(from int, limit float64, demands []func(time.Duration) float64, tolerance float64) int {
	d := make([]float64, len(demands))
	for i := max(from, 0); i < len(r.Seconds); i++ {
		s := r.Seconds[i]
		for j, f := range demands {
			d[j] = f(s.At - time.Millisecond)
		}
		fair, ok := FairShares(limit, d), true
		for j := range d {
			ok = ok && s.Share[j] >= (1-tolerance)*fair[j]
		}
		if ok {
			return i
		}
	}
	return -1
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
