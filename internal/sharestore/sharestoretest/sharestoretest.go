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

// RunRenewer runs the suite of a sharestore.Renewer: Renew extends the
// leases of an unchanged budget at the shares held, and refuses, changing
// nothing, whenever the budget changed since the caller's split.
func RunRenewer(t *testing.T, newStore func(t *testing.T) (sharestore.Store, Clock)) {
	ctx := context.Background()
	const ttl = 2 * time.Second
	split := func(t *testing.T, s sharestore.Store, clk Clock, bud sharestore.Budget, mine []sharestore.Demand) []int64 {
		t.Helper()
		got, err := s.Allocate(ctx, clk.Now(), bud, mine, ttl, 0)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	renew := func(t *testing.T, s sharestore.Store, clk Clock, bud sharestore.Budget, mine []sharestore.Demand) ([]int64, bool) {
		t.Helper()
		got, ok, err := s.(sharestore.Renewer).Renew(ctx, clk.Now(), bud, mine, ttl)
		if err != nil {
			t.Fatal(err)
		}
		return got, ok
	}
	t.Run("RenewExtendsTheLeases", func(t *testing.T) {
		s, clk := newStore(t)
		bud := sharestore.Budget{Key: "r:10:" + t.Name(), Limit: 100}
		mine := []sharestore.Demand{{ID: "a", Demand: 30}, {ID: "b", Demand: 500}}
		want := split(t, s, clk, bud, mine)
		for i := range 4 { // twice the TTL: only renewals keep the leases
			clk.Advance(ttl / 2)
			got, ok := renew(t, s, clk, bud, mine)
			if !ok || fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("renewal %d: %v, %v; want %v, true", i, got, ok, want)
			}
		}
		// The leases run: a newcomer waits for them.
		got := split(t, s, clk, bud, []sharestore.Demand{{ID: "c", Demand: 500}})
		if got[0] != 0 {
			t.Errorf("a newcomer got %v beside renewed leases of %v", got, want)
		}
	})
	t.Run("RenewRefusesAChangedBudget", func(t *testing.T) {
		for _, tc := range []struct {
			name   string
			change func(t *testing.T, s sharestore.Store, clk Clock, bud *sharestore.Budget, mine *[]sharestore.Demand)
		}{
			{"another demand", func(t *testing.T, s sharestore.Store, clk Clock, bud *sharestore.Budget, mine *[]sharestore.Demand) {
				(*mine)[0].Demand++
			}},
			{"an instance fewer", func(t *testing.T, s sharestore.Store, clk Clock, bud *sharestore.Budget, mine *[]sharestore.Demand) {
				*mine = (*mine)[1:]
			}},
			{"another limit", func(t *testing.T, s sharestore.Store, clk Clock, bud *sharestore.Budget, mine *[]sharestore.Demand) {
				bud.Limit = 90
			}},
			{"another caller's lease", func(t *testing.T, s sharestore.Store, clk Clock, bud *sharestore.Budget, mine *[]sharestore.Demand) {
				split(t, s, clk, *bud, []sharestore.Demand{{ID: "x", Demand: 5}})
			}},
			{"the leases expired", func(t *testing.T, s sharestore.Store, clk Clock, bud *sharestore.Budget, mine *[]sharestore.Demand) {
				clk.Advance(ttl)
			}},
			{"a lease expired and was forgotten", func(t *testing.T, s sharestore.Store, clk Clock, bud *sharestore.Budget, mine *[]sharestore.Demand) {
				// "gone" stopped reporting: once its lease ends, the room
				// it leaves must be split, not the old shares renewed.
				split(t, s, clk, *bud, append([]sharestore.Demand{{ID: "gone", Demand: 500}}, *mine...))
				clk.Advance(ttl / 2)
				split(t, s, clk, *bud, *mine)
				clk.Advance(ttl / 2)
				if sw, ok := s.(interface{ Sweep(time.Time) }); ok {
					sw.Sweep(clk.Now())
				}
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				s, clk := newStore(t)
				bud := sharestore.Budget{Key: "r:11:" + t.Name(), Limit: 100}
				mine := []sharestore.Demand{{ID: "a", Demand: 30}, {ID: "b", Demand: 500}}
				split(t, s, clk, bud, mine)
				tc.change(t, s, clk, &bud, &mine)
				if got, ok := renew(t, s, clk, bud, mine); ok {
					t.Fatalf("renewed %v after %s", got, tc.name)
				}
			})
		}
	})
	t.Run("ARefusalChangesNothing", func(t *testing.T) {
		s, clk := newStore(t)
		bud := sharestore.Budget{Key: "r:12:" + t.Name(), Limit: 100}
		split(t, s, clk, bud, []sharestore.Demand{{ID: "a", Demand: 500}})
		clk.Advance(ttl / 2)
		// Refused (another demand): a's lease is not extended, so it is
		// reclaimed at its first expiry.
		if _, ok := renew(t, s, clk, bud, []sharestore.Demand{{ID: "a", Demand: 400}}); ok {
			t.Fatal("renewed with another demand")
		}
		clk.Advance(ttl / 2)
		if got := split(t, s, clk, bud, []sharestore.Demand{{ID: "b", Demand: 500}}); got[0] != 100 {
			t.Errorf("after a's lease: b gets %v, want [100]", got)
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
