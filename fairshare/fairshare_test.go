package fairshare

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var t0 = time.Unix(1_700_000_000, 0)

func mine(id string, demand, held int64) Claim {
	return Claim{ID: id, Demand: demand, Held: held, Expires: t0.Add(3 * time.Second), Mine: true}
}

func other(id string, demand, held int64, expires time.Duration) Claim {
	return Claim{ID: id, Demand: demand, Held: held, Expires: t0.Add(expires)}
}

func TestAllocate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		limit  int64
		claims []Claim
		tol    float64
		want   []int64
	}{
		{"one instance, small demand", 100, []Claim{mine("a", 10, 0)}, 0, []int64{10}},
		{"one instance, large demand", 100, []Claim{mine("a", 500, 0)}, 0, []int64{100}},
		{"equal split", 100, []Claim{mine("a", 500, 0), mine("b", 500, 0)}, 0, []int64{50, 50}},
		{"remainder in ID order", 10, []Claim{mine("c", 9, 0), mine("a", 9, 0), mine("b", 9, 0)}, 0, []int64{3, 4, 3}},
		{"small demand satisfied, rest split", 100,
			[]Claim{mine("a", 10, 0), mine("b", 500, 0), mine("c", 500, 0)}, 0, []int64{10, 45, 45}},
		{"skewed: one at 10x", 100,
			[]Claim{mine("a", 100, 0), mine("b", 10, 0), mine("c", 10, 0)}, 0, []int64{80, 10, 10}},
		{"new instance gets a fair share at once", 100,
			[]Claim{mine("a", 500, 100), mine("b", Unknown, 0)}, 0, []int64{50, 50}},
		{"others' leases count until they expire", 100,
			[]Claim{other("x", 500, 60, 2*time.Second), mine("a", 500, 0)}, 0, []int64{60, 40}},
		{"an expired lease is reclaimed", 100,
			[]Claim{other("x", 500, 60, 0), mine("a", 500, 40)}, 0, []int64{0, 100}},
		{"others holding less than their fair share leave the rest", 100,
			[]Claim{other("x", 20, 20, time.Second), mine("a", 500, 0)}, 0, []int64{20, 80}},
		{"others above their fair share: mine waits for them to shrink", 100,
			[]Claim{other("x", 500, 90, time.Second), mine("a", 500, 0)}, 0, []int64{90, 10}},
		{"within tolerance keeps the held share", 100,
			[]Claim{mine("a", 48, 52), mine("b", 500, 48)}, 0.1, []int64{52, 48}},
		{"an increase within tolerance that does not fit is applied", 100,
			[]Claim{mine("a", 500, 48), mine("b", 500, 52), other("x", 4, 4, time.Second)}, 0.1, []int64{48, 48, 4}},
		{"limit 0", 0, []Claim{mine("a", 5, 0)}, 0, []int64{0}},
		{"no claims", 10, nil, 0, []int64{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Allocate(tc.limit, tc.claims, t0, tc.tol)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Allocate (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSmooth(t *testing.T) {
	for _, tc := range []struct {
		prev    float64
		known   bool
		count   uint64
		elapsed time.Duration
		want    float64
	}{
		{0, false, 10, 0, 10},               // the first report: elapsed 0 counts as one interval
		{0, false, 30, 3 * time.Second, 10}, // a rate
		{10, true, 30, time.Second, 24},     // a rise: mostly the newest
		{30, true, 10, time.Second, 12},     // a fall: almost at once
	} {
		if got := Smooth(tc.prev, tc.known, tc.count, tc.elapsed, time.Second); got != tc.want {
			t.Errorf("Smooth(%v, %v, %d, %v) = %v, want %v", tc.prev, tc.known, tc.count, tc.elapsed, got, tc.want)
		}
	}
	for _, tc := range []struct {
		rate float64
		fill time.Duration
		want int64
	}{{10, 2 * time.Second, 20}, {10.2, time.Second, 11}, {0, time.Second, 1}, {math.Inf(1), time.Second, math.MaxInt64 / 2}} {
		if got := Demand(tc.rate, tc.fill); got != tc.want {
			t.Errorf("Demand(%v/s, %v) = %d, want %d", tc.rate, tc.fill, got, tc.want)
		}
	}
}

// randomClaims draws a budget's claims: some mine, some others' with leases
// live or not, demands small, large or unknown.
func randomClaims(r *rand.Rand, limit int64, allMine bool) []Claim {
	n := r.IntN(12)
	cs := make([]Claim, n)
	var othersHeld int64
	for i := range cs {
		c := Claim{ID: fmt.Sprintf("i%02d", i), Demand: r.Int64N(2*limit + 2), Mine: allMine || r.IntN(2) == 0,
			Expires: t0.Add(time.Duration(r.IntN(5)-2) * time.Second)}
		if r.IntN(5) == 0 {
			c.Demand = Unknown
		}
		if r.IntN(2) == 0 && limit > othersHeld {
			c.Held = r.Int64N(limit - othersHeld + 1)
			othersHeld += c.Held
		}
		cs[i] = c
	}
	return cs
}

// TestAllocateProperties checks the invariants on random budgets.
func TestAllocateProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for iter := range 20000 {
		limit := r.Int64N(200)
		allMine := iter%2 == 0
		cs := randomClaims(r, limit, allMine)
		tol := []float64{0, 0.1}[r.IntN(2)]
		got := Allocate(limit, cs, t0, tol)
		checkInvariants(t, limit, cs, got, tol, allMine)
		if t.Failed() {
			t.Fatalf("limit %d, tolerance %v, claims %+v: shares %v", limit, tol, cs, got)
		}
	}
}

func FuzzAllocate(f *testing.F) {
	f.Add(uint64(1), uint64(2), uint8(100), true)
	f.Fuzz(func(t *testing.T, s1, s2 uint64, limit uint8, allMine bool) {
		r := rand.New(rand.NewPCG(s1, s2))
		cs := randomClaims(r, int64(limit), allMine)
		got := Allocate(int64(limit), cs, t0, 0.1)
		checkInvariants(t, int64(limit), cs, got, 0.1, allMine)
	})
}

func checkInvariants(t *testing.T, limit int64, cs []Claim, got []int64, tol float64, allMine bool) {
	t.Helper()
	var sum int64
	for i, c := range cs {
		s := got[i]
		sum += s
		if s < 0 {
			t.Errorf("%s: share %d < 0", c.ID, s)
		}
		if !c.Mine {
			if want := c.held(t0); s != want {
				t.Errorf("%s (not mine): share %d, want what it holds, %d", c.ID, s, want)
			}
			continue
		}
		if c.Demand >= 0 && s > c.Demand && s != c.held(t0) {
			t.Errorf("%s: share %d above its demand %d", c.ID, s, c.Demand)
		}
	}
	if sum > limit {
		t.Errorf("shares sum to %d > limit %d", sum, limit)
	}
	if !allMine || tol != 0 || len(cs) == 0 {
		return
	}
	// Max-min fairness: no instance gets more than another whose demand is
	// unmet, by more than the one token of the remainder; an unmet demand
	// means the whole budget is handed out; a new instance gets a share
	// whenever the budget has one token per instance.
	unmet := false
	for i, c := range cs {
		if c.Demand < 0 || got[i] < c.Demand {
			unmet = true
			for j := range cs {
				if got[j] > got[i]+1 {
					t.Errorf("%s gets %d while %s, unmet (demand %d), gets %d", cs[j].ID, got[j], c.ID, c.Demand, got[i])
				}
			}
			if c.Demand < 0 && got[i] == 0 && limit >= int64(len(cs)) {
				t.Errorf("new instance %s gets nothing of %d", c.ID, limit)
			}
		}
	}
	if unmet && sum != limit {
		t.Errorf("a demand is unmet but only %d of %d is handed out", sum, limit)
	}
}

// TestSmallest: the first n elements are the n smallest, for every n.
func TestSmallest(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 2000 {
		v := r.Perm(r.IntN(40) + 1)
		n := r.IntN(len(v) + 1)
		smallest(v, n, func(a, b int) bool { return a < b })
		for _, x := range v[:n] {
			if x >= n {
				t.Fatalf("n %d: %v holds %d among the first", n, v, x)
			}
		}
	}
}
