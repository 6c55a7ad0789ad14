package rlqssim

import (
	"context"
	"fmt"
	"math"
	"testing"
	"testing/fstest"
	"time"

	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/rlqs"
	"github.com/charonlimit/charon/internal/sharestore"
)

// virtual is an rlqs.Allocator on the clock of a Simulate run: it ticks
// every interval and flushes a twentieth of an interval after a report, as
// its Run would.
type virtual struct {
	a                *rlqs.Allocator
	interval         time.Duration
	now, tick, flush time.Time
}

// newVirtual serves the rule `api: search` at limit per second on store
// (nil: a memory store of its own), its clock starting at start.
func newVirtual(t *testing.T, limit string, store sharestore.Store, start time.Time, o rlqs.Options) *virtual {
	t.Helper()
	cfg, _, err := config.Load(fstest.MapFS{"web.yaml": {Data: []byte(`
domain: web
descriptors:
  - key: api
    value: search
    rate_limit: {unit: second, requests_per_unit: ` + limit + `}
`)}}, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if store == nil {
		store = &sharestore.Memory{}
	}
	v := &virtual{now: start}
	o.Store, o.Now = store, func() time.Time { return v.now }
	o.Tree = func() *descriptors.Tree { return cfg.Tree }
	v.interval = o.Interval
	if v.interval == 0 {
		v.interval = rlqs.DefaultInterval
	}
	v.tick = start.Add(v.interval)
	if v.a, err = rlqs.New(o); err != nil {
		t.Fatal(err)
	}
	return v
}

func (v *virtual) Advance(ctx context.Context, now time.Time) {
	v.now = now
	if !v.flush.IsZero() && !now.Before(v.flush) {
		v.flush = time.Time{}
		v.a.Flush(ctx)
	}
	if !now.Before(v.tick) {
		v.tick = v.tick.Add(v.interval)
		v.a.Tick(ctx)
	}
}

func (v *virtual) Open() Stream { return &virtualStream{v: v, s: v.a.Open()} }

type virtualStream struct {
	v *virtual
	s *rlqs.Stream
}

func (vs *virtualStream) Report(ctx context.Context, domain string, us []Usage) error {
	ru := make([]rlqs.Usage, len(us))
	for i, u := range us {
		ru[i] = rlqs.Usage{Bucket: u.Bucket, Elapsed: u.Elapsed, Allowed: u.Allowed, Denied: u.Denied}
	}
	if vs.v.flush.IsZero() {
		vs.v.flush = vs.v.now.Add(vs.v.interval / 20)
	}
	return vs.s.Report(ctx, domain, ru)
}

// Pending is the filter's reading of the actions the server would send.
func (vs *virtualStream) Pending() []Assignment {
	var out []Assignment
	for _, a := range vs.s.Pending() {
		as := Assignment{Bucket: a.Bucket, TTL: a.TTL}
		switch a.Kind {
		case rlqs.Abandon:
			as.Abandon = true
		case rlqs.Allow:
			as.Blanket = AllowAll
		case rlqs.Deny:
			as.Blanket = DenyAll
		default:
			as.MaxTokens, as.TokensPerFill, as.Fill = a.Burst, a.Tokens, a.Fill
		}
		out = append(out, as)
	}
	return out
}

var t0 = time.Unix(1_700_000_000, 0)

// steady are Envoys of constant rates.
func steady(rates ...float64) []func(time.Duration) float64 {
	ds := make([]func(time.Duration) float64, len(rates))
	for i, r := range rates {
		ds[i] = func(time.Duration) float64 { return r }
	}
	return ds
}

// checkSkewed checks a run of one Envoy at 200/s and nine at 8/s against
// 100/s from second from on: each small Envoy gets at least served of its
// requests (max-min fairness owes them all), the allowed total is within
// off of the limit, the large Envoy gets most of the rest, the shares never
// sum above the limit, they settle near the fair shares within settle
// seconds, and new strategies are rare once settled.
func checkSkewed(t *testing.T, res Result, from, settle int, served, off float64) {
	t.Helper()
	const limit = 100.0
	rates := []float64{200, 8, 8, 8, 8, 8, 8, 8, 8, 8}
	fair := FairShares(limit, rates)
	frac, allowed := res.Served(from)
	news, renewed := res.Assignments(from)
	over, under := res.Windows(limit, from, 10)
	settled := res.Settled(0, limit, steady(rates...), 0.15)
	t.Logf("from second %d: served %.3f; allowed %.1f/s of %v (10 s windows: %.1f%% over, %.1f%% under); "+
		"settled at %d s; %d new strategies, %d renewals", from, frac, allowed, limit, 100*over, 100*under, settled, news, renewed)
	for i := 1; i < len(frac); i++ {
		if frac[i] < served {
			t.Errorf("Envoy %d at %v/s got %.1f%% of its requests, want at least %v%%", i, rates[i], 100*frac[i], 100*served)
		}
	}
	if math.Abs(allowed-limit) > off*limit {
		t.Errorf("allowed %.1f/s, want within %v%% of %v", allowed, 100*off, limit)
	}
	if got := frac[0] * rates[0]; got < 0.85*fair[0] {
		t.Errorf("the Envoy at %v/s got %.1f/s, want most of its fair share %.1f/s", rates[0], got, fair[0])
	}
	if settled < 0 || settled > settle {
		t.Errorf("shares settled within 15%% of the fair shares at second %d, want by %d", settled, settle)
	}
	// At most one new strategy per Envoy per 20 s, once settled.
	if most := len(rates) * (len(res.Seconds) - from) / 20; news > most {
		t.Errorf("%d new strategies in %d s, want at most %d", news, len(res.Seconds)-from, most)
	}
	for _, s := range res.Seconds {
		var sum float64
		for _, sh := range s.Share {
			sum += max(sh, 0)
		}
		if sum > limit+1e-9 {
			t.Fatalf("second %v: shares sum to %v > %v", s.At, sum, limit)
		}
	}
}

// TestSkewedDemandAtEnvoyCadence: the case of one Envoy at 200/s and nine
// at 8/s against 100/s, on a virtual clock, as Envoy's filter reports
// (every 5 s, whole seconds elapsed, Poisson arrivals), its first request
// at once or each Envoy's at its own instant of the first 5 s.
func TestSkewedDemandAtEnvoyCadence(t *testing.T) {
	for _, spread := range []bool{false, true} {
		for seed := range uint64(3) {
			t.Run(fmt.Sprintf("spread %v seed %d", spread, seed), func(t *testing.T) {
				v := newVirtual(t, "100", nil, t0, rlqs.Options{})
				res, err := Simulate(context.Background(), Options{Domain: "web", Bucket: map[string]string{"api": "search"},
					Demands: steady(200, 8, 8, 8, 8, 8, 8, 8, 8, 8), Duration: 120 * time.Second, Seed: seed, Spread: spread}, t0, []Server{v}, nil)
				if err != nil {
					t.Fatal(err)
				}
				// The first rates come with the reports at 5 s (10 s
				// spread): settled by 15 s.
				checkSkewed(t, res, 15, 40, 0.95, 0.05)
			})
		}
	}
}

// TestSkewedDemandEverySecond: the same at the cadence of the filter's
// reporting_interval of 1 s (what rlqs-sim --interval 1s simulates).
func TestSkewedDemandEverySecond(t *testing.T) {
	v := newVirtual(t, "100", nil, t0, rlqs.Options{})
	res, err := Simulate(context.Background(), Options{Domain: "web", Bucket: map[string]string{"api": "search"},
		Demands: steady(200, 8, 8, 8, 8, 8, 8, 8, 8, 8), Interval: time.Second, Duration: 120 * time.Second, Seed: 1}, t0, []Server{v}, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkSkewed(t, res, 15, 40, 0.95, 0.05)
}

// TestShiftingHeavyEnvoy: twenty Envoys at 40/s against 1000/s, one of
// them at 400/s in turn for 15 s each (rlqs.md's example), at Envoy's
// cadence. A shift is seen only at the next reports, up to 5 s later, and
// the shares follow it: they never sum above the limit, and over the run
// the allowed total stays within 10 % of it.
func TestShiftingHeavyEnvoy(t *testing.T) {
	const limit, n, shift = 1000.0, 20, 15 * time.Second
	demands := make([]func(time.Duration) float64, n)
	for i := range demands {
		demands[i] = func(at time.Duration) float64 {
			if int(at/shift)%n == i {
				return 400
			}
			return 40
		}
	}
	v := newVirtual(t, "1000", nil, t0, rlqs.Options{})
	res, err := Simulate(context.Background(), Options{Domain: "web", Bucket: map[string]string{"api": "search"},
		Demands: demands, Duration: 120 * time.Second, Seed: 1}, t0, []Server{v}, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, allowed := res.Served(5)
	over, under := res.Windows(limit, 5, 10)
	news, renewed := res.Assignments(5)
	var settle []int
	for at := 15; at < len(res.Seconds); at += 15 {
		settle = append(settle, res.Settled(at, limit, demands, 0.15)-at)
	}
	t.Logf("allowed %.1f/s of %v (10 s windows: %.1f%% over, %.1f%% under); settled %v s after each shift; %d new strategies, %d renewals",
		allowed, limit, 100*over, 100*under, settle, news, renewed)
	if math.Abs(allowed-limit) > 0.10*limit {
		t.Errorf("allowed %.1f/s, want within 10%% of %v", allowed, limit)
	}
	for _, s := range res.Seconds {
		var sum float64
		for _, sh := range s.Share {
			sum += max(sh, 0)
		}
		if sum > limit+1e-9 {
			t.Fatalf("second %v: shares sum to %v > %v", s.At, sum, limit)
		}
	}
}
