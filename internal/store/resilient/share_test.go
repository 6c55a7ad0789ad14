package resilient_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/resilient"
	"github.com/charonlimit/charon/internal/store/storetest"
	"github.com/charonlimit/charon/tiers"
)

func TestShareOf(t *testing.T) {
	for _, c := range []struct{ v, n, want int64 }{
		{10, 3, 3}, // rounded down: 3 replicas grant 9 of 10
		{9, 3, 3},
		{100, 7, 14},
		{2, 3, 1}, // at least 1
		{1, 5, 1},
		{0, 3, 0},   // a limit rejecting everything stays so
		{-1, 3, -1}, // not a limit
		{10, 1, 10}, // one replica: the whole limit
		{10, 0, 10}, // never counted
	} {
		if got := resilient.ShareOf(c.v, c.n); got != c.want {
			t.Errorf("ShareOf(%d, %d) = %d, want %d", c.v, c.n, got, c.want)
		}
	}
}

func TestSharePolicy(t *testing.T) {
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Fatal(err)
	}
	huge := tiers.MaxDuration/2 + time.Second
	for _, c := range []struct {
		name   string
		p      *tiers.Policy
		n      int64
		want   *tiers.Policy
		sameAs bool // want p itself
	}{
		{name: "tiers, hard and global limits", n: 3,
			p: &tiers.Policy{Kind: tiers.KindTiers, HardLimit: 20, GlobalLimit: 100, Tiers: []tiers.Tier{
				{Limit: 10, Window: time.Second, Active: tiers.Unbounded},
				{Limit: 2, Window: time.Minute, Active: time.Hour, Cooldown: time.Hour, Skippable: true}}},
			want: &tiers.Policy{Kind: tiers.KindTiers, HardLimit: 6, GlobalLimit: 33, Tiers: []tiers.Tier{
				{Limit: 3, Window: time.Second, Active: tiers.Unbounded},
				{Limit: 1, Window: time.Minute, Active: time.Hour, Cooldown: time.Hour, Skippable: true}}}},
		{name: "no hard or global limit stays none", n: 4,
			p:    &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 8, Window: time.Second, Active: tiers.Unbounded}}},
			want: &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 2, Window: time.Second, Active: tiers.Unbounded}}}},
		{name: "fixed window, post-paid kept", n: 3,
			p:    &tiers.Policy{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Limit: 100, Unit: tiers.UnitMinute}, Overdraft: true},
			want: &tiers.Policy{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Limit: 33, Unit: tiers.UnitMinute}, Overdraft: true}},
		{name: "fixed window of 0 rejects everything still", n: 3,
			p:    &tiers.Policy{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Limit: 0, Unit: tiers.UnitMinute}},
			want: &tiers.Policy{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Limit: 0, Unit: tiers.UnitMinute}}},
		{name: "calendar quota", n: 2,
			p:    &tiers.Policy{Kind: tiers.KindQuota, Quota: tiers.Quota{Limit: 1001, Period: tiers.PeriodMonth, Location: paris}},
			want: &tiers.Policy{Kind: tiers.KindQuota, Quota: tiers.Quota{Limit: 500, Period: tiers.PeriodMonth, Location: paris}}},
		{name: "token bucket: the refill rate divided exactly", n: 3,
			p:    &tiers.Policy{Kind: tiers.KindTokenBucket, Bucket: tiers.TokenBucket{Capacity: 100, Refill: 10, Per: time.Second}},
			want: &tiers.Policy{Kind: tiers.KindTokenBucket, Bucket: tiers.TokenBucket{Capacity: 33, Refill: 10, Per: 3 * time.Second}}},
		{name: "token bucket whose period cannot grow: the refill divided", n: 3,
			p:    &tiers.Policy{Kind: tiers.KindTokenBucket, Bucket: tiers.TokenBucket{Capacity: 1, Refill: 7, Per: huge}},
			want: &tiers.Policy{Kind: tiers.KindTokenBucket, Bucket: tiers.TokenBucket{Capacity: 1, Refill: 2, Per: huge}}},
		{name: "one replica", n: 1, sameAs: true,
			p: &tiers.Policy{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Limit: 100, Unit: tiers.UnitMinute}}},
		{name: "never counted", n: 0, sameAs: true,
			p: &tiers.Policy{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Limit: 100, Unit: tiers.UnitMinute}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := clonePolicy(c.p)
			got := resilient.SharePolicy(c.p, c.n)
			if c.sameAs {
				if got != c.p {
					t.Fatalf("SharePolicy(p, %d) = %+v, want p itself", c.n, got)
				}
				return
			}
			if diff := cmp.Diff(c.want, got, cmp.Comparer(func(a, b *time.Location) bool { return a.String() == b.String() })); diff != "" {
				t.Errorf("SharePolicy(p, %d) (-want +got):\n%s", c.n, diff)
			}
			if got.Shape() != c.p.Shape() {
				t.Errorf("the share's shape %x differs from the policy's %x: its local counts would start afresh", got.Shape(), c.p.Shape())
			}
			if err := tiers.Validate(got); err != nil {
				t.Errorf("the share is invalid: %v", err)
			}
			if diff := cmp.Diff(before, c.p, cmp.Comparer(func(a, b *time.Location) bool { return a.String() == b.String() })); diff != "" {
				t.Errorf("SharePolicy changed its argument (-before +after):\n%s", diff)
			}
		})
	}
}

func clonePolicy(p *tiers.Policy) *tiers.Policy {
	q := *p
	q.Tiers = append([]tiers.Tier(nil), p.Tiers...)
	return &q
}

// TestLocalModeShares: with the remote down, the local failure mode grants
// each replica its share of every kind of limit (rounded down, at least 1),
// and the whole limit when no replicas were counted; a new count applies
// the new share to the counts already made locally.
func TestLocalModeShares(t *testing.T) {
	fixed := &tiers.Policy{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Limit: 10, Unit: tiers.UnitHour}}
	quota := &tiers.Policy{Kind: tiers.KindQuota, Quota: tiers.Quota{Limit: 10, Period: tiers.PeriodDay}}
	bucket := &tiers.Policy{Kind: tiers.KindTokenBucket, Bucket: tiers.TokenBucket{Capacity: 10, Refill: 1, Per: time.Hour}}
	hard := &tiers.Policy{Kind: tiers.KindTiers, HardLimit: 10, Tiers: []tiers.Tier{{Limit: 100, Window: time.Second, Active: tiers.Unbounded}}}
	tier := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 10, Window: time.Hour, Active: tiers.Unbounded}}}
	glob := &tiers.Policy{Kind: tiers.KindTiers, GlobalLimit: 10, Tiers: []tiers.Tier{{Limit: 100, Window: time.Second, Active: tiers.Unbounded}}}
	tiny := &tiers.Policy{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Limit: 2, Unit: tiers.UnitHour}}
	for _, c := range []struct {
		name     string
		p        *tiers.Policy
		replicas int
		want     int
	}{
		{"fixed window", fixed, 3, 3},
		{"calendar quota", quota, 3, 3},
		{"token bucket", bucket, 3, 3},
		{"hard limit", hard, 3, 3},
		{"tier", tier, 3, 3},
		{"tier, 4 replicas", tier, 4, 2},
		{"limit below the replicas: 1 each", tiny, 3, 1},
		{"never counted: the whole limit", tier, 0, 10},
		{"one replica: the whole limit", tier, 1, 10},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFake()
			f.set(fail)
			s := resilient.New(f, resilient.Options{Now: newClock().Now})
			defer s.Close()
			s.SetReplicas(c.replicas)
			if got := grantsUntilRejected(t, s, c.p, "a", 0); got != c.want {
				t.Errorf("%d replicas: %d single hits granted locally, want %d", c.replicas, got, c.want)
			}
		})
	}
	t.Run("global limit over domains", func(t *testing.T) {
		f := newFake()
		f.set(fail)
		s := resilient.New(f, resilient.Options{Now: newClock().Now})
		defer s.Close()
		s.SetReplicas(3)
		got := 0
		for _, d := range []string{"a", "b", "c", "d"} {
			got += grantsUntilRejected(t, s, glob, d, 0)
		}
		if got != 3 {
			t.Errorf("global limit 10 over 4 domains, 3 replicas: %d granted, want 3", got)
		}
	})
	t.Run("pacing reserves the share", func(t *testing.T) {
		f := newFake()
		f.set(fail)
		s := resilient.New(f, resilient.Options{Now: newClock().Now})
		defer s.Close()
		s.SetReplicas(3)
		it := take(tier, "a", 1)
		it.Key.PolicyID = tier.Shape()
		out := make([]tiers.Decision, 1)
		granted := 0
		for range 20 {
			if _, err := s.Reserve(context.Background(), t0, 0, []store.Item{it}, out); err != nil {
				t.Fatal(err)
			}
			if out[0].OK {
				granted++
			}
		}
		if granted != 3 {
			t.Errorf("3 replicas: %d reservations granted locally of a limit of 10, want 3", granted)
		}
	})
	t.Run("a new count applies to the local counts", func(t *testing.T) {
		f := newFake()
		f.set(fail)
		s := resilient.New(f, resilient.Options{Now: newClock().Now})
		defer s.Close()
		s.SetReplicas(5)
		if got := grantsUntilRejected(t, s, tier, "a", 0); got != 2 {
			t.Fatalf("5 replicas: %d granted, want 2", got)
		}
		s.SetReplicas(2) // 5 each: 3 more
		if got := grantsUntilRejected(t, s, tier, "a", 0); got != 3 {
			t.Errorf("then 2 replicas: %d more granted, want 3 (5 of the 2 already counted)", got)
		}
		if st := s.Stats(); st.Replicas != 2 {
			t.Errorf("Stats().Replicas = %d, want 2", st.Replicas)
		}
	})
}

// grantsUntilRejected asks single hits of p for domain until one is
// rejected, at t0+offset, and returns how many were granted.
func grantsUntilRejected(t *testing.T, s store.Store, p *tiers.Policy, domain string, offset time.Duration) int {
	t.Helper()
	for n := 0; n < 1000; n++ {
		it := take(p, domain, 1)
		it.Key.PolicyID = p.Shape()
		if d := storetest.Decide(t, s, t0.Add(offset), it); !d[0].OK {
			return n
		}
	}
	t.Fatalf("1000 hits granted")
	return 0
}

// TestSharesConcurrent: replicas counted while decisions run, every
// decision of a call sees one share (no race, no mixed policies).
func TestSharesConcurrent(t *testing.T) {
	f := newFake()
	f.set(fail)
	s := resilient.New(f, resilient.Options{Now: newClock().Now})
	defer s.Close()
	p := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 1000, Window: time.Hour, Active: tiers.Unbounded}}}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 200 {
				if w == 0 {
					s.SetReplicas(i%5 + 1)
					s.Flush()
				}
				a, b := take(p, "x", 1), take(p, "x", 1)
				a.Key.PolicyID, b.Key.PolicyID = p.Shape(), p.Shape()
				storetest.Decide(t, s, t0, a, b)
			}
		})
	}
	wg.Wait()
}

// TestReplicasMetric: charon_store_replicas exports the count last set.
func TestReplicasMetric(t *testing.T) {
	s := resilient.New(newFake(), resilient.Options{})
	defer s.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(resilient.NewCollector(s.Stats))
	s.SetReplicas(3)
	want := "# HELP charon_store_replicas Replicas sharing the remote store, this one included, as last counted while it answered (0: never counted); the local failure mode divides every limit by it.\n# TYPE charon_store_replicas gauge\ncharon_store_replicas 3\n"
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "charon_store_replicas"); err != nil {
		t.Error(err)
	}
}
