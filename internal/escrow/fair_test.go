package escrow

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/charonlimit/charon/fairshare"
	"github.com/charonlimit/charon/internal/sharestore"
)

// TestFairSharesFollowDemand: two replicas in escrow on one pair report
// their demand to one share store; after a 10x shift of demand from one to
// the other, their shares are the max-min fair split of the new demands
// within two rebalance intervals (to the tolerance).
func TestFairSharesFollowDemand(t *testing.T) {
	for _, tc := range []struct {
		name   string
		phase  time.Duration // of the shift after a round
		bFirst bool          // B ticks before A
	}{
		{"on a round", 0, false},
		{"a third in", 325 * time.Millisecond, false},
		{"just before a round", 975 * time.Millisecond, false},
		{"B ticks first", 500 * time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) { testFairShift(t, tc.phase, tc.bFirst) })
	}
}

func testFairShift(t *testing.T, phase time.Duration, bFirst bool) {
	clk := newClock()
	clk.t = clk.t.Truncate(time.Second)
	mem := newMem(t)
	shares := &sharestore.Memory{}
	const limit = 1200
	window := 10 * time.Second
	rebalance := time.Second
	p := sliding(limit, window)
	it := item("a", p, 1)
	newReplica := func(id string) *Store {
		s, err := New(Options{Remote: mem, Default: true, Now: clk.Now, Threshold: 5,
			Size: SizeFair, Shares: shares, ID: id, Rebalance: rebalance})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	a, b := newReplica("a"), newReplica("b")
	share := func(s *Store) int64 {
		v, ok := s.entries.Load(it.Key)
		if !ok {
			return -1
		}
		e := v.(*entry)
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.share
	}
	// fair is the split of the limit by demands per second (per window).
	fair := func(da, db float64) (int64, int64) {
		sh := fairshare.Allocate(limit, []fairshare.Claim{
			{ID: "a", Demand: fairshare.Demand(da, window), Mine: true},
			{ID: "b", Demand: fairshare.Demand(db, window), Mine: true},
		}, clk.Now(), 0)
		return sh[0], sh[1]
	}
	ctx := context.Background()
	step := 25 * time.Millisecond
	var debtA, debtB float64
	run := func(d time.Duration, rateA, rateB float64) {
		for end := clk.Now().Add(d); clk.Now().Before(end); {
			now := clk.Add(step)
			debtA += rateA * step.Seconds()
			debtB += rateB * step.Seconds()
			for ; debtA >= 1; debtA-- {
				decide(t, a, now, it)
			}
			for ; debtB >= 1; debtB-- {
				decide(t, b, now, it)
			}
			if bFirst {
				b.Tick(ctx)
				a.Tick(ctx)
			} else {
				a.Tick(ctx)
				b.Tick(ctx)
			}
		}
	}
	run(10*time.Second+phase, 200, 20)
	wa, wb := fair(200, 20)
	if ga, gb := share(a), share(b); !near(ga, wa) || !near(gb, wb) {
		t.Fatalf("before the shift: shares %d, %d, want %d, %d", ga, gb, wa, wb)
	}
	run(2*rebalance, 20, 200)
	wa, wb = fair(20, 200)
	if ga, gb := share(a), share(b); !near(ga, wa) || !near(gb, wb) {
		t.Fatalf("two rebalances after the shift: shares %d, %d, want %d, %d", ga, gb, wa, wb)
	}
	// The shared store never counts more than the limit.
	if got := count(t, mem, clk.Now(), it); got > limit {
		t.Fatalf("the store counts %d, limit %d", got, limit)
	}
}

// TestLeasesHoldAtMostTheShare: a replica's leases never hold more than
// its fair share in the window (another replica's claim, fixed, takes the
// rest); beyond it its requests take the shared path.
func TestLeasesHoldAtMostTheShare(t *testing.T) {
	clk := newClock()
	mem := newMem(t)
	shares := &sharestore.Memory{}
	const limit = 400
	window := 2 * time.Second
	p := sliding(limit, window)
	it := item("a", p, 1)
	s, err := New(Options{Remote: mem, Default: true, Now: clk.Now, Lease: 100 * time.Millisecond, Threshold: 5,
		Size: SizeFair, Shares: shares, ID: "me", Rebalance: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	b := sharestore.Budget{Key: "escrow:" + it.Key.Resource + ":7:" + it.Key.Domain, Limit: limit}
	for range 200 {
		now := clk.Add(25 * time.Millisecond)
		// The other replica wants everything, and renews its claim.
		if _, err := shares.Allocate(ctx, now, b, []sharestore.Demand{{ID: "other", Demand: 10 * limit}}, time.Second, tolerance); err != nil {
			t.Fatal(err)
		}
		for range 10 { // 400 per second: twice the limit alone
			decide(t, s, now, it)
		}
		s.Tick(ctx)
		v, ok := s.entries.Load(it.Key)
		if !ok {
			continue
		}
		e := v.(*entry)
		e.mu.Lock()
		occ, sh := e.occupancy(now, window), e.share
		e.mu.Unlock()
		if sh >= 0 && occ > sh {
			t.Fatalf("at %v: leases hold %d in the window, share %d", now, occ, sh)
		}
	}
	st := s.Stats()
	if st.Leases == 0 || st.OverShare == 0 || st.Remote == 0 {
		t.Fatalf("stats %+v: want leases, leases not asked for over the share, and the shared path beyond", st)
	}
}

// near reports whether a share is within fairshare's tolerance of want
// (10% of the fair split, and a token).
func near(got, want int64) bool {
	return math.Abs(float64(got-want)) <= 0.1*float64(want)+1
}
