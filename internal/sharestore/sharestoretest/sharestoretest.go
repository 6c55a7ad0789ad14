// Package sharestoretest is the conformance suite every sharestore.Store
// runs: two replicas on one budget never hold more than its limit, shares
// converge to max-min fair, and a lost instance's share is reclaimed after
// its lease and not before.
package sharestoretest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/charonlimit/charon/fairshare"
	"github.com/charonlimit/charon/internal/sharestore"
)

// Clock is the time the suite gives the store: Now is passed to Allocate,
// Advance moves it on (a store on Redis' clock waits for real time instead:
// its Advance may sleep).
type Clock interface {
	Now() time.Time
	Advance(d time.Duration)
}

// Run runs the suite. newStores returns two stores on one backing state
// (two replicas) and the clock they run on; budgets are fresh per subtest.
func Run(t *testing.T, newStores func(t *testing.T) (a, b sharestore.Store, clk Clock)) {
	ctx := context.Background()
	const tol = 0
	t.Run("TwoReplicasNeverExceedTheLimit", func(t *testing.T) {
		a, b, clk := newStores(t)
		bud := sharestore.Budget{Key: "r:1:" + t.Name(), Limit: 100}
		ttl := time.Hour
		ma := []sharestore.Demand{{ID: "a1", Demand: fairshare.Unknown}, {ID: "a2", Demand: 500}, {ID: "a3", Demand: 10}}
		mb := []sharestore.Demand{{ID: "b1", Demand: 500}, {ID: "b2", Demand: fairshare.Unknown}, {ID: "b3", Demand: 500}}
		var sa, sb []int64
		for i := range 12 {
			var err error
			if i%2 == 0 {
				sa, err = a.Allocate(ctx, clk.Now(), bud, ma, ttl, tol)
			} else {
				sb, err = b.Allocate(ctx, clk.Now(), bud, mb, ttl, tol)
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := sum(sa) + sum(sb); got > bud.Limit {
				t.Fatalf("round %d: replicas hold %v + %v = %d > %d", i, sa, sb, got, bud.Limit)
			}
			ma[0].Demand, mb[1].Demand = 500, 500 // known after a first report
		}
		// Converged: a3 gets its 10, the five others 18 each.
		want := fmt.Sprint([]int64{18, 18, 10}, []int64{18, 18, 18})
		if got := fmt.Sprint(sa, sb); got != want {
			t.Errorf("shares %s, want %s", got, want)
		}
	})
	t.Run("LostInstanceReclaimedAfterItsLease", func(t *testing.T) {
		a, _, clk := newStores(t)
		bud := sharestore.Budget{Key: "r:2:" + t.Name(), Limit: 60}
		ttl := 2 * time.Second
		s, err := a.Allocate(ctx, clk.Now(), bud, []sharestore.Demand{{ID: "lost", Demand: 500}}, ttl, tol)
		if err != nil || s[0] != 60 {
			t.Fatalf("first instance: %v, %v; want [60]", s, err)
		}
		// "lost" no longer reports: its share counts until its lease ends.
		s, err = a.Allocate(ctx, clk.Now(), bud, []sharestore.Demand{{ID: "new", Demand: 500}}, ttl, tol)
		if err != nil || s[0] != 0 {
			t.Fatalf("while the lost lease runs: %v, %v; want [0]", s, err)
		}
		for deadline := time.Now().Add(10 * time.Second); ; {
			clk.Advance(ttl / 4)
			s, err = a.Allocate(ctx, clk.Now(), bud, []sharestore.Demand{{ID: "new", Demand: 500}}, ttl, tol)
			if err != nil {
				t.Fatal(err)
			}
			if s[0] == 60 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the lost share was not reclaimed: %v", s)
			}
		}
	})
	t.Run("NewInstanceShareAtOnce", func(t *testing.T) {
		a, _, clk := newStores(t)
		bud := sharestore.Budget{Key: "r:3:" + t.Name(), Limit: 90}
		if _, err := a.Allocate(ctx, clk.Now(), bud, []sharestore.Demand{{ID: "x", Demand: 500}, {ID: "y", Demand: 500}}, time.Hour, tol); err != nil {
			t.Fatal(err)
		}
		s, err := a.Allocate(ctx, clk.Now(), bud, []sharestore.Demand{{ID: "x", Demand: 500}, {ID: "y", Demand: 500}, {ID: "z", Demand: fairshare.Unknown}}, time.Hour, tol)
		if err != nil || fmt.Sprint(s) != "[30 30 30]" {
			t.Fatalf("shares %v, %v; want [30 30 30]", s, err)
		}
	})
}

func sum(v []int64) (s int64) {
	for _, x := range v {
		s += x
	}
	return s
}

// FakeClock is a Clock that moves only when told. Safe for use by one
// goroutine.
type FakeClock struct{ T time.Time }

func (c *FakeClock) Now() time.Time          { return c.T }
func (c *FakeClock) Advance(d time.Duration) { c.T = c.T.Add(d) }
