package rlqs

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/charonlimit/charon/fairshare"
)

func TestWindow(t *testing.T) {
	for _, tc := range []struct {
		name          string
		gap, reported time.Duration
		want          time.Duration
	}{
		{"Envoy's 5 s timer, a little late", 5020 * time.Millisecond, 5 * time.Second, 5020 * time.Millisecond},
		{"a bucket created 1.9 s before the timer: elapsed cut to 1 s", 1900 * time.Millisecond, time.Second, 1900 * time.Millisecond},
		{"the stream's messages delayed: the report's second bounds it", 7 * time.Second, 5 * time.Second, 5999 * time.Millisecond},
		{"a report faster than its elapsed time (clocks apart)", 4500 * time.Millisecond, 5 * time.Second, 5 * time.Second},
	} {
		if got := window(tc.gap, tc.reported); got != tc.want {
			t.Errorf("%s: window(%v, %v) = %v, want %v", tc.name, tc.gap, tc.reported, got, tc.want)
		}
	}
}

// TestEstimateFiveSecondReports: reports every 5 s of 8 per second average
// to 8; the noise of the estimate falls as the reports add up, as a mean's
// does (the Poisson noise of 8/s over the time seen), until the horizon; a
// report within that noise moves the estimate a little; a report far
// outside it is a change, believed at once, one less far out only when the
// next confirms it.
func TestEstimateFiveSecondReports(t *testing.T) {
	var e estimate
	counts := []uint64{40, 44, 36, 40, 42, 38}
	for i, n := range counts {
		e.add(n, 5*time.Second)
		seen := 5 * float64(i+1)
		if want := math.Sqrt(e.rate / seen); i < 5 && math.Abs(e.sd()-want) > 1e-9 {
			t.Errorf("after %d reports: sd %.3f, want %.3f (a mean over %v s)", i+1, e.sd(), want, seen)
		}
	}
	if math.Abs(e.rate-8) > 0.1 {
		t.Errorf("rate %.2f after reports of 8/s, want 8", e.rate)
	}
	if e.sd() > 0.6 {
		t.Errorf("sd %.2f after 30 s of 8/s, want under 0.6 (16%% of one report's)", e.sd())
	}
	prev := e.rate
	e.add(46, 5*time.Second) // 9.2/s: within one report's noise
	if e.rate <= prev || e.rate > 8.6 {
		t.Errorf("rate %.2f after a report of 9.2/s, want a little above %.2f", e.rate, prev)
	}
	// 13/s: four standard deviations out, which may be chance; the next
	// report that far confirms it, and the two are believed.
	e.add(65, 5*time.Second)
	if e.rate > 9.5 {
		t.Errorf("rate %.2f after one report of 13/s, want a little above %.2f", e.rate, prev)
	}
	e.add(66, 5*time.Second)
	if math.Abs(e.rate-13.1) > 1e-9 {
		t.Errorf("rate %.2f after two reports of 13/s, want 13.1 (their mean) at once", e.rate)
	}
	e.add(200, 5*time.Second) // 40/s: far out, a change believed at once
	if e.rate != 40 {
		t.Errorf("rate %.2f after a report of 40/s, want 40 at once", e.rate)
	}
}

// TestElapsedWholeSeconds: Envoy reports a bucket it created 1.9 s before
// its timer with an elapsed time of 1 s; the counts cover 1.9 s, and the
// demand is theirs over 1.9 s, not over 1 s.
func TestElapsedWholeSeconds(t *testing.T) {
	f := newFixture(t, Options{})
	s := f.a.Open()
	ctx := context.Background()
	if err := s.Report(ctx, "web", []Usage{{Bucket: search, Allowed: 1}}); err != nil {
		t.Fatal(err)
	}
	f.clk.Advance(1900 * time.Millisecond)
	if err := s.Report(ctx, "web", []Usage{{Bucket: search, Elapsed: time.Second, Allowed: 19}}); err != nil {
		t.Fatal(err)
	}
	if got := f.a.Stats(false).Rules[0].Demand; math.Abs(got-10) > 1e-9 {
		t.Errorf("demand %.2f/s after 19 requests in 1.9 s reported as 1 s, want 10", got)
	}
}

func TestClaimOf(t *testing.T) {
	steady := func(rate, sd float64) *estimate {
		// v such that sd() is sd.
		return &estimate{rate: rate, v: sd * sd / rate, known: true, age: 30}
	}
	const fill = 10 * time.Second // tokens per 10 s: 80 is 8/s
	for _, tc := range []struct {
		name    string
		cur     int64
		e       *estimate
		starved bool
		want    int64
	}{
		{"no claim yet: the estimate", fairshare.Unknown, steady(8.13, 1), false, 82},
		{"within the noise: kept", 80, steady(8.7, 0.4), false, 80},
		{"within the tolerance: kept", 80, steady(8.3, 0.05), false, 80},
		{"above the band: the estimate", 80, steady(9.2, 0.4), false, 92},
		{"just above the band: beyond the tolerance", 80, steady(8.45, 0.05), false, 85},
		{"below the band: the estimate", 80, steady(6.9, 0.4), false, 69},
		{"starved: beyond twice the tolerance", 80, steady(8.0, 0.4), true, 89},
		{"starved, the estimate higher still", 80, steady(9.5, 0.4), true, 95},
	} {
		if got := claimOf(tc.cur, tc.e, fill, 0.05, tc.starved); got != tc.want {
			t.Errorf("%s: claimOf(%d, %.2f±%.2f, starved %v) = %d, want %d", tc.name, tc.cur, tc.e.rate, tc.e.sd(), tc.starved, got, tc.want)
		}
	}
}

// fiveSeconds has two Envoys report the search rule (100/s) every 5 s, as
// Envoy's filter does: a wanting 200/s, b the counts given (per 5 s), then
// ticks five times.
func fiveSeconds(t *testing.T, f *fixture, a, b *Stream, bCount uint64) {
	t.Helper()
	ctx := context.Background()
	f.clk.Advance(time.Second)
	for _, r := range []struct {
		s *Stream
		n uint64
	}{{a, 1000}, {b, bCount}} {
		if err := r.s.Report(ctx, "web", []Usage{{Bucket: search, Elapsed: 5 * time.Second, Allowed: r.n}}); err != nil {
			t.Fatal(err)
		}
	}
	f.a.Flush(ctx)
	f.a.Tick(ctx)
	for range 4 {
		f.clk.Advance(time.Second)
		f.a.Tick(ctx)
	}
}

// TestHysteresis: an Envoy whose reports vary as random arrivals do
// (8/s, ±10 %) keeps its assignment, renewed, and so does the Envoy that
// takes the rest of the limit; when its demand really moves, both get new
// ones: once the estimate has moved out of its noise (to 10/s, within one
// report's noise), at once for a change far outside it (to 40/s).
func TestHysteresis(t *testing.T) {
	f := newFixture(t, Options{})
	a, b := f.a.Open(), f.a.Open()
	report(t, a, 0, 0, search)
	report(t, b, 0, 0, search)
	var r sends
	for _, n := range []uint64{40, 40, 40} { // settle
		fiveSeconds(t, f, a, b, n)
	}
	r.drain([]*Stream{a, b}, f.clk.Now(), nil)
	for i, n := range []uint64{44, 37, 41, 36, 43, 39, 42, 38} {
		fiveSeconds(t, f, a, b, n)
		renewals, others := r.drain([]*Stream{a, b}, f.clk.Now(), nil)
		if others != 0 || renewals == 0 {
			t.Fatalf("report %d of b (%d in 5 s): %d new assignments and %d renewals, want renewals only", i, n, others, renewals)
		}
	}
	shares := map[string]float64{}
	for _, sh := range f.a.Stats(true).Rules[0].Shares {
		shares[sh.Stream] = sh.Share
	}
	if shares[b.id] < 8 || shares[b.id] > 8.5 || shares[a.id]+shares[b.id] != 100 {
		t.Errorf("shares %v, want b about 8 per second, a the rest", shares)
	}
	// b's demand moves to 10/s, within one report's noise: the estimate
	// follows over a few reports, and the shares move once, or twice.
	news := 0
	for range 6 {
		fiveSeconds(t, f, a, b, 50)
		_, others := r.drain([]*Stream{a, b}, f.clk.Now(), nil)
		news += others
	}
	if news < 2 || news > 4 {
		t.Errorf("b's demand moved to 10/s: %d new assignments over 30 s, want 2 to 4", news)
	}
	// The estimate, an average over 30 s, is on its way; the bucket b holds
	// (MetBurst) covers the rest, and turns requests away once spent
	// (TestStarvedClaimRises).
	for _, sh := range f.a.Stats(true).Rules[0].Shares {
		if sh.Stream == b.id && (sh.Share < 9 || sh.Share > 11) {
			t.Errorf("b's share %v per second, want 9 to 10", sh.Share)
		}
	}
	// Then to 40/s: a change, followed at once.
	fiveSeconds(t, f, a, b, 200)
	if _, others := r.drain([]*Stream{a, b}, f.clk.Now(), nil); others != 2 {
		t.Errorf("after b's demand moved to 40/s: %d new assignments, want 2 at once", others)
	}
}

// TestStarvedClaimRises: an Envoy whose share meets its claim but that
// still turned requests away (its bucket ran dry: its claim is low) claims
// more, beyond the tolerance, so that the split gives it more; one whose
// share was just changed is not judged by the denials of the old one.
func TestStarvedClaimRises(t *testing.T) {
	f := newFixture(t, Options{})
	a, b := f.a.Open(), f.a.Open()
	report(t, a, 0, 0, search)
	report(t, b, 0, 0, search)
	for range 3 {
		fiveSeconds(t, f, a, b, 40)
	}
	before := b.buckets[lookupKey("web", search)].want.Load()
	ctx := context.Background()
	f.clk.Advance(5 * time.Second)
	if err := b.Report(ctx, "web", []Usage{{Bucket: search, Elapsed: 5 * time.Second, Allowed: 36, Denied: 4}}); err != nil {
		t.Fatal(err)
	}
	after := b.buckets[lookupKey("web", search)].want.Load()
	if float64(after) < float64(before)*1.1 {
		t.Errorf("claim %d after 10%% of b's requests were turned away with its claim %d met, want above %d", after, before, int64(float64(before)*1.1))
	}
}

// lookupKey is a stream's key of a bucket of domain.
func lookupKey(domain string, id map[string]string) string {
	k, _ := appendLookup(nil, nil, domain, id)
	return string(k)
}

// TestBurst: an Envoy whose share meets its demand gets a bucket deep
// enough for its random arrivals (MetBurst tokens, at most 10 s of its
// share); one whose share falls short of its demand a quarter of a
// second's share.
func TestBurst(t *testing.T) {
	f := newFixture(t, Options{})
	a, b := f.a.Open(), f.a.Open()
	report(t, a, 0, 0, search)
	report(t, b, 0, 0, search)
	a.Pending()
	b.Pending()
	fiveSeconds(t, f, a, b, 40)
	last := func(s *Stream) Action {
		p := s.Pending()
		if len(p) == 0 {
			t.Fatal("no assignment")
		}
		return p[len(p)-1]
	}
	if got := last(b); got.Tokens != 80 || got.Fill != 10*time.Second || got.Burst != MetBurst {
		t.Errorf("b, met at 8/s: %+v, want 80 tokens per 10 s holding %d", got, MetBurst)
	}
	if got := last(a); got.Tokens != 920 || got.Burst != 23 {
		t.Errorf("a, short of its 200/s: %+v, want 920 tokens per 10 s holding 23 (a quarter of 92)", got)
	}
	bg := &budget{fill: 10 * time.Second, scale: 10}
	if got := bg.burst(10, true); got != 10 {
		t.Errorf("met at 1/s: a bucket of %d, want 10 (10 s of its share)", got)
	}
}
