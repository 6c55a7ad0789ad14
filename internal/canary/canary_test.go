package canary

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/internal/store/memstore"
)

var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

func load(t testing.TB, text string) *config.Config {
	t.Helper()
	cfg, _, err := config.Load(fstest.MapFS{"d.yaml": {Data: []byte(text)}}, config.Options{})
	if err != nil {
		t.Fatalf("%v\n%s", err, text)
	}
	return cfg
}

func liveEngine(cfg *config.Config, now func() time.Time) *engine.Engine {
	e := engine.New(engine.Options{Store: memstore.New(memstore.Options{}), Now: now})
	e.SetTree(cfg.Tree)
	return e
}

func userReq(user string) *engine.Request {
	return &engine.Request{Domain: "d", Descriptors: []engine.Descriptor{{Entries: []descriptors.Entry{{Key: "user", Value: user}}}}}
}

func TestCounts(t *testing.T) {
	now := t0
	clock := func() time.Time { return now }
	live := liveEngine(load(t, "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 3}\n"), clock)
	c := New(Options{Engine: engine.Options{Now: clock}})
	defer c.Close()
	c.SetConfig(load(t, "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 5}\n  - key: other\n    rate_limit: {unit: second, requests_per_unit: 1}\n"))
	for range 6 {
		resp, err := live.ShouldRateLimit(context.Background(), userReq("alice"))
		if err != nil {
			t.Fatal(err)
		}
		c.Observe(context.Background(), userReq("alice"), resp)
		now = now.Add(time.Millisecond)
	}
	got := c.Report()
	want := Report{Files: []string{"d.yaml"}, Requests: Outcomes{Agree: 4, WouldGrant: 2}, Rules: []RuleCounts{
		{Domain: "d", Rule: "other", Resource: "d/other"},
		{Domain: "d", Rule: "user", Resource: "d/user", Outcomes: Outcomes{Agree: 4, WouldGrant: 2}},
		{Rule: NoRule},
	}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("Report (-want +got):\n%s", d)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	if n, err := testutil.GatherAndCount(reg, "charon_candidate_decisions_total"); err != nil || n != 9 {
		t.Errorf("%d series of charon_candidate_decisions_total (%v), want 9: three rules, three outcomes", n, err)
	}
	rec := httptest.NewRecorder()
	c.ServeHTTP(rec, httptest.NewRequest("GET", "/candidate", nil))
	if !strings.Contains(rec.Body.String(), `"would_grant": 2`) {
		t.Errorf("GET /candidate: %s", rec.Body.String())
	}
	xs, err := c.Explain(context.Background(), userReq("alice"))
	if err != nil || len(xs) != 1 || xs[0].View.Tiers[0].Hits != 5 {
		t.Errorf("the candidate's explanation %+v, %v: want 5 hits of its own state", xs, err)
	}
}

// TestNeverChangesAnswers: with random live and candidate configurations
// and random requests, a live engine whose answers a Canary observes
// answers exactly as one alone, and the requests are left as they were.
func TestNeverChangesAnswers(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for draw := range 20 {
		liveCfg, candCfg := load(t, randomConfig(r)), load(t, randomConfig(r))
		now := t0
		clock := func() time.Time { return now }
		alone, observed := liveEngine(liveCfg, clock), liveEngine(liveCfg, clock)
		c := New(Options{Engine: engine.Options{Now: clock}})
		c.SetConfig(candCfg)
		for i := range 300 {
			now = now.Add(time.Duration(r.IntN(200)) * time.Millisecond)
			req := randomRequest(r)
			want, err1 := alone.ShouldRateLimit(context.Background(), req)
			before := cloneRequest(req)
			got, err2 := observed.ShouldRateLimit(context.Background(), req)
			if (err1 == nil) != (err2 == nil) {
				t.Fatalf("draw %d request %d: errors %v and %v", draw, i, err1, err2)
			}
			if err2 != nil {
				continue
			}
			c.Observe(context.Background(), req, got)
			if d := cmp.Diff(want, got, cmp.AllowUnexported(engine.Response{})); d != "" {
				t.Fatalf("draw %d request %d: the observed answer differs (-alone +observed):\n%s", draw, i, d)
			}
			if d := cmp.Diff(before, req); d != "" {
				t.Fatalf("draw %d request %d: Observe changed the request:\n%s", draw, i, d)
			}
		}
		if rep := c.Report(); rep.Requests.Agree+rep.Requests.WouldReject+rep.Requests.WouldGrant+rep.Errors == 0 {
			t.Fatalf("draw %d: the canary decided nothing", draw)
		}
		c.Close()
	}
}

func cloneRequest(q *engine.Request) *engine.Request {
	c := *q
	c.Descriptors = make([]engine.Descriptor, len(q.Descriptors))
	for i, d := range q.Descriptors {
		d.Entries = append([]descriptors.Entry(nil), d.Entries...)
		if d.Override != nil {
			o := *d.Override
			d.Override = &o
		}
		c.Descriptors[i] = d
	}
	return &c
}

func randomRequest(r *rand.Rand) *engine.Request {
	q := &engine.Request{Domain: "d", Hits: uint32(r.IntN(3))}
	for range 1 + r.IntN(3) {
		var d engine.Descriptor
		for range 1 + r.IntN(2) {
			d.Entries = append(d.Entries, descriptors.Entry{Key: []string{"a", "b"}[r.IntN(2)], Value: []string{"x", "y", "xz", "w"}[r.IntN(4)]})
		}
		if r.IntN(10) == 0 {
			d.Override = &engine.Override{RequestsPerUnit: uint32(r.IntN(3)), Unit: 1}
		}
		q.Descriptors = append(q.Descriptors, d)
	}
	return q
}

// randomConfig draws a small configuration of domain d: keys a and b,
// fixed values, wildcards and keys alone, limits, unlimited, shadow and
// quota rules, nested one level.
func randomConfig(r *rand.Rand) string {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n")
	var level func(indent string, depth int)
	level = func(indent string, depth int) {
		used := map[string]bool{}
		for range 1 + r.IntN(3) {
			key := []string{"a", "b"}[r.IntN(2)]
			val := []string{"", "x", "y", "x*"}[r.IntN(4)]
			if used[key+"="+val] {
				continue
			}
			used[key+"="+val] = true
			fmt.Fprintf(&b, "%s- key: %s\n", indent, key)
			if val != "" {
				fmt.Fprintf(&b, "%s  value: %q\n", indent, val)
			}
			switch r.IntN(6) {
			case 0:
				fmt.Fprintf(&b, "%s  rate_limit: {unlimited: true}\n", indent)
			case 1, 2, 3:
				fmt.Fprintf(&b, "%s  rate_limit: {unit: second, requests_per_unit: %d}\n", indent, r.IntN(5))
				switch r.IntN(4) {
				case 0:
					fmt.Fprintf(&b, "%s  shadow_mode: true\n", indent)
				case 1:
					fmt.Fprintf(&b, "%s  quota_mode: true\n", indent)
				}
			case 4:
				fmt.Fprintf(&b, "%s  tiers: [{limit: %d, window: 1s}, {limit: %d, window: 1s, active: 2s, cooldown: 3s}]\n", indent, 1+r.IntN(3), 4+r.IntN(3))
			}
			if depth < 1 && r.IntN(2) == 0 {
				fmt.Fprintf(&b, "%s  descriptors:\n", indent)
				level(indent+"    ", depth+1)
			}
		}
	}
	level("  ", 0)
	return b.String()
}

// BenchmarkObserve is the candidate's cost per request: Observe of a
// one-descriptor request of 1,000 users on the memory store, beside the
// live decision it observes (BenchmarkObserve/live).
func BenchmarkObserve(b *testing.B) {
	cfg := load(b, "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 100}\n")
	live := liveEngine(cfg, nil)
	c := New(Options{})
	defer c.Close()
	c.SetConfig(cfg)
	reqs := make([]*engine.Request, 1000)
	for i := range reqs {
		reqs[i] = userReq(fmt.Sprint("u", i))
	}
	ctx := context.Background()
	var resp engine.Response
	b.Run("live", func(b *testing.B) {
		b.ReportAllocs()
		for i := range b.N {
			if err := live.Decide(ctx, reqs[i%len(reqs)], &resp); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("candidate", func(b *testing.B) {
		b.ReportAllocs()
		for i := range b.N {
			c.Observe(ctx, reqs[i%len(reqs)], &resp)
		}
	})
}

// TestPacedCandidateNeverHolds: a candidate whose rule paces decides the
// request as paced (OK, its grant reserved) without holding the live
// request, whatever the Sleep the live engine's options carry: the one
// given here would hold the caller until its deadline.
func TestPacedCandidateNeverHolds(t *testing.T) {
	now := t0
	clock := func() time.Time { return now }
	live := liveEngine(load(t, "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), clock)
	slept := 0
	holding := func(ctx context.Context, d time.Duration) error {
		slept++
		<-ctx.Done()
		return ctx.Err()
	}
	c := New(Options{Engine: engine.Options{Now: clock, Sleep: holding}})
	defer c.Close()
	c.SetConfig(load(t, "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 1}\n    pace: 10s\n"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for range 2 {
		resp, err := live.ShouldRateLimit(ctx, userReq("alice"))
		if err != nil {
			t.Fatal(err)
		}
		c.Observe(ctx, userReq("alice"), resp)
	}
	if slept != 0 {
		t.Errorf("the candidate slept %d times", slept)
	}
	// The second request: live rejects it, the candidate paces it (OK).
	if got := c.Report().Requests; got != (Outcomes{Agree: 1, WouldGrant: 1}) {
		t.Errorf("outcomes %+v, want 1 agree and 1 would-grant (the paced one)", got)
	}
}
