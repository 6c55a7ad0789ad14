package rlqs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/sharestore"
	"github.com/charonlimit/charon/tiers"
)

const rules = `
domain: web
descriptors:
  - key: api
    value: search
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 600}
  - key: api
    value: health
    rate_limit: {unlimited: true}
`

func loadTree(t *testing.T, yaml string) *descriptors.Tree {
	t.Helper()
	cfg, _, err := config.Load(fstest.MapFS{"web.yaml": {Data: []byte(yaml)}}, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Tree
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type fixture struct {
	a    *Allocator
	clk  *clock
	tree *descriptors.Tree
	mu   sync.Mutex
}

func newFixture(t *testing.T, o Options) *fixture {
	f := &fixture{clk: &clock{t: time.Unix(1_700_000_000, 0)}, tree: loadTree(t, rules)}
	if o.Store == nil {
		o.Store = &sharestore.Memory{}
	}
	o.Now = f.clk.Now
	o.Tree = func() *descriptors.Tree { f.mu.Lock(); defer f.mu.Unlock(); return f.tree }
	a, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	f.a = a
	return f
}

var search = map[string]string{"api": "search"}

func report(t *testing.T, s *Stream, perSecond uint64, elapsed time.Duration, bucket map[string]string) {
	t.Helper()
	n := perSecond * uint64(max(elapsed, time.Second)/time.Second)
	if err := s.Report(context.Background(), "web", []Usage{{Bucket: bucket, Elapsed: elapsed, Allowed: n}}); err != nil {
		t.Fatal(err)
	}
	s.a.Flush(context.Background())
}

// assign is the assignment of perSecond of the rule `api: search` (100 per
// second, split in tokens per 10 s) to an Envoy whose demand it does not
// meet, or not known yet: a bucket of a quarter of a second's share.
func assign(perSecond int64) Action {
	return Action{Bucket: search, Kind: Assign, Tokens: 10 * perSecond, Burst: (perSecond + 3) / 4, Fill: 10 * time.Second, TTL: DefaultTTL}
}

func TestStartingShareAndSplit(t *testing.T) {
	f := newFixture(t, Options{})
	a := f.a.Open()
	report(t, a, 0, 0, search)
	if diff := cmp.Diff([]Action{assign(100)}, a.Pending()); diff != "" {
		t.Fatalf("first instance (-want +got):\n%s", diff)
	}
	b := f.a.Open()
	report(t, b, 0, 0, search)
	if diff := cmp.Diff([]Action{assign(50)}, b.Pending()); diff != "" {
		t.Errorf("second instance, at once (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]Action{assign(50)}, a.Pending()); diff != "" {
		t.Errorf("first instance, shrunk at once (-want +got):\n%s", diff)
	}
}

// TestSkewedDemand: an instance needing little gets what it needs (with
// headroom), the other the rest; the shares follow when demand shifts.
func TestSkewedDemand(t *testing.T) {
	f := newFixture(t, Options{})
	a, b := f.a.Open(), f.a.Open()
	report(t, a, 0, 0, search)
	report(t, b, 0, 0, search)
	for range 6 {
		f.clk.Advance(time.Second)
		report(t, a, 90, time.Second, search)
		report(t, b, 10, time.Second, search)
		f.a.Tick(context.Background())
	}
	st := f.a.Stats(true)
	got := map[string]float64{}
	for _, sh := range st.Rules[0].Shares {
		got[sh.Stream] = sh.Share
	}
	if want := map[string]float64{a.id: 90, b.id: 10}; !cmp.Equal(got, want) {
		t.Errorf("shares %v, want %v", got, want)
	}
	// The demand shifts: b now wants 80, a 20.
	for range 8 {
		f.clk.Advance(time.Second)
		report(t, a, 20, time.Second, search)
		report(t, b, 80, time.Second, search)
		f.a.Tick(context.Background())
	}
	got = map[string]float64{}
	for _, sh := range f.a.Stats(true).Rules[0].Shares {
		got[sh.Stream] = sh.Share
	}
	if got[a.id] > 22 || got[b.id] < 78 || got[a.id]+got[b.id] > 100 {
		t.Errorf("after the shift: shares %v, want a about 21, b the rest", got)
	}
}

// TestRenewBeforeExpiry: an unchanged share is sent again before its TTL
// ends, and not at every tick.
func TestRenewBeforeExpiry(t *testing.T) {
	f := newFixture(t, Options{})
	a := f.a.Open()
	report(t, a, 0, 0, search)
	a.Pending()
	var sends []int
	for i := 1; i <= 6; i++ {
		f.clk.Advance(time.Second)
		report(t, a, 500, time.Second, search)
		f.a.Tick(context.Background())
		if p := a.Pending(); len(p) > 0 {
			sends = append(sends, i)
		}
	}
	if want := []int{2, 4, 6}; !cmp.Equal(sends, want) {
		t.Errorf("renewed at seconds %v, want %v (TTL 3 s, interval 1 s)", sends, want)
	}
}

// TestLostStreamReclaimedAfterTTL: a closed stream's share counts until its
// TTL, then the survivor gets the whole budget.
func TestLostStreamReclaimedAfterTTL(t *testing.T) {
	f := newFixture(t, Options{})
	a, b := f.a.Open(), f.a.Open()
	report(t, a, 0, 0, search)
	report(t, b, 0, 0, search)
	b.Pending()
	a.Close()
	var got []Action
	for range 4 {
		f.clk.Advance(time.Second)
		report(t, b, 500, time.Second, search)
		f.a.Tick(context.Background())
		got = append(got, b.Pending()...)
	}
	want := []Action{assign(50), assign(100)}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("survivor's assignments (-want +got):\n%s", diff)
	}
}

func TestFallbacksAndAbandon(t *testing.T) {
	f := newFixture(t, Options{Unmatched: DenyAll, IdleAfter: 5 * time.Second})
	s := f.a.Open()
	ctx := context.Background()
	unknown := map[string]string{"api": "nope"}
	health := map[string]string{"api": "health"}
	if err := s.Report(ctx, "web", []Usage{{Bucket: unknown}, {Bucket: health}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Report(ctx, "elsewhere", []Usage{{Bucket: search}}); err != nil {
		t.Fatal(err)
	}
	want := []Action{{Bucket: unknown, Kind: Deny, TTL: time.Minute}, {Bucket: health, Kind: Allow, TTL: time.Minute},
		{Bucket: search, Kind: Deny, TTL: time.Minute}}
	if diff := cmp.Diff(want, s.Pending()); diff != "" {
		t.Errorf("fallbacks (-want +got):\n%s", diff)
	}
	// The same bucket id in another domain is another bucket.
	report(t, s, 0, 0, search)
	if p := s.Pending(); len(p) != 1 || p[0].Kind != Assign {
		t.Errorf("search in web after search in elsewhere: %+v, want an assignment", p)
	}
	for _, tc := range []struct {
		domain string
		usages []Usage
	}{{"", []Usage{{Bucket: search}}}, {"web", []Usage{{}}}, {"web", []Usage{{Bucket: map[string]string{"": "x"}}}},
		{"web", []Usage{{Bucket: map[string]string{"k": strings.Repeat("v", MaxLen+1)}}}}} {
		if err := s.Report(ctx, tc.domain, tc.usages); !errors.Is(err, ErrInput) {
			t.Errorf("Report(%q, %v) = %v, want ErrInput", tc.domain, tc.usages, err)
		}
	}

	// Idle: no requests for IdleAfter abandons the bucket.
	s = f.a.Open()
	user := map[string]string{"user": "alice"}
	report(t, s, 1, 0, user)
	if p := s.Pending(); len(p) != 1 || p[0].Kind != Assign || p[0].Tokens != 600 || p[0].Fill != time.Minute {
		t.Fatalf("user bucket: %+v, want 600 per minute", p)
	}
	var last []Action
	for range 5 {
		f.clk.Advance(time.Second)
		report(t, s, 0, time.Second, user)
		f.a.Tick(ctx)
		last = s.Pending()
	}
	if diff := cmp.Diff([]Action{{Bucket: user, Kind: Abandon}}, last); diff != "" {
		t.Errorf("idle bucket (-want +got):\n%s", diff)
	}

	// A removed rule abandons its buckets.
	report(t, s, 10, 0, user)
	s.Pending()
	f.mu.Lock()
	f.tree = loadTree(t, "domain: web\n")
	f.mu.Unlock()
	f.a.Tick(ctx)
	if diff := cmp.Diff([]Action{{Bucket: user, Kind: Abandon}}, s.Pending()); diff != "" {
		t.Errorf("rule removed (-want +got):\n%s", diff)
	}
}

type failing struct{}

func (failing) Allocate(context.Context, time.Time, sharestore.Budget, []sharestore.Demand, time.Duration, float64) ([]int64, error) {
	return nil, sharestore.ErrUnavailable
}

// TestStoreDown: nothing is sent, so the last assignments run to their TTL.
func TestStoreDown(t *testing.T) {
	f := newFixture(t, Options{Store: failing{}})
	s := f.a.Open()
	report(t, s, 0, 0, search)
	f.a.Tick(context.Background())
	if p := s.Pending(); len(p) != 0 {
		t.Errorf("sent %+v with the store down, want nothing", p)
	}
	if got := f.a.Stats(false).StoreErrors; got != 2 {
		t.Errorf("StoreErrors = %d, want 2", got)
	}
}

func TestRate(t *testing.T) {
	tree := loadTree(t, rules)
	for _, tc := range []struct {
		id    map[string]string
		limit int64
		fill  time.Duration
	}{{search, 1000, 10 * time.Second}, {map[string]string{"user": "x"}, 600, time.Minute}} {
		b, _, fill, _, ok := budgetOf(tree, "web", tc.id)
		if !ok || b.Limit != tc.limit || fill != tc.fill {
			t.Errorf("budgetOf(%v) = %v %v %v, want %d per %v", tc.id, b, fill, ok, tc.limit, tc.fill)
		}
	}
	// A rate limit in calendar units: its limit per the period's nominal
	// length, not a policy that rejects everything.
	month := &tiers.Policy{Kind: tiers.KindQuota, Quota: tiers.Quota{Limit: 3000, Period: tiers.PeriodMonth, Location: time.UTC}}
	if limit, fill, ok := Rate(month); !ok || limit != 3000 || fill != 30*24*time.Hour {
		t.Errorf("Rate of a calendar month of 3000: %d per %v, %v; want 3000 per 720h", limit, fill, ok)
	}
}

// TestHoldAfterStart: with a Hold, nothing is assigned until it is over,
// then the next tick assigns.
func TestHoldAfterStart(t *testing.T) {
	f := newFixture(t, Options{Hold: DefaultTTL})
	s := f.a.Open()
	report(t, s, 0, 0, search)
	for i := 1; i <= 3; i++ {
		f.clk.Advance(time.Second)
		report(t, s, 50, time.Second, search)
		f.a.Tick(context.Background())
		got := s.Pending()
		if i < 3 && len(got) != 0 {
			t.Fatalf("%d s after the start, within the hold: sent %+v", i, got)
		}
		if i == 3 && (len(got) != 1 || got[0].Kind != Assign) {
			t.Fatalf("after the hold: sent %+v, want an assignment", got)
		}
	}
}

func TestTooManyBuckets(t *testing.T) {
	f := newFixture(t, Options{})
	s := f.a.Open()
	us := make([]Usage, MaxBuckets+1)
	for i := range us {
		us[i] = Usage{Bucket: map[string]string{"user": fmt.Sprint(i)}}
	}
	if err := s.Report(context.Background(), "web", us); !errors.Is(err, ErrTooManyBuckets) {
		t.Fatalf("got %v, want ErrTooManyBuckets", err)
	}
}
