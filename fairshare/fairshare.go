package fairshare

import (
	"cmp"
	"math"
	"slices"
	"time"
)

// Unknown is the Demand of an instance that has not reported a rate yet: it
// counts as wanting the whole budget.
const Unknown int64 = -1

// Claim is one instance's standing on a budget.
type Claim struct {
	// ID names the instance; IDs are unique within a budget.
	ID string
	// Demand is the tokens per fill interval the instance wants (smoothed,
	// with the caller's headroom), or Unknown.
	Demand int64
	// Held is the share the instance holds (its last assignment) and
	// Expires when its lease lapses. A share at or past Expires holds
	// nothing.
	Held    int64
	Expires time.Time
	// Mine is set for the instances this call allocates to; the others keep
	// what they hold until it expires.
	Mine bool
}

// live reports whether c's share still counts at now.
func (c *Claim) live(now time.Time) bool { return c.Mine || now.Before(c.Expires) }

// held is what c holds at now.
func (c *Claim) held(now time.Time) int64 {
	if c.Held <= 0 || !now.Before(c.Expires) {
		return 0
	}
	return c.Held
}

// Allocate returns the shares of claims at now, in their order: for a claim
// that is Mine, its new share; for another, what it holds (0 once its lease
// has expired: reclaimed). tolerance (a fraction, e.g. 0.1) is the change of
// a held share that is not worth a new assignment.
//
// Invariants, for any input with limit >= 0: the shares sum to at most
// limit plus whatever the others already held above it (their leases are
// never revoked; when they fit, so does the sum); no share of Mine exceeds
// its demand (a known one); and when every live claim is Mine, shares are
// max-min fair up to the tolerance.
func Allocate(limit int64, claims []Claim, now time.Time, tolerance float64) []int64 {
	out := make([]int64, len(claims))
	var others int64
	var live []int // indices of the live claims
	var mine []int
	for i := range claims {
		c := &claims[i]
		if !c.live(now) {
			continue
		}
		live = append(live, i)
		if c.Mine {
			mine = append(mine, i)
		} else {
			out[i] = c.held(now)
			others += out[i]
		}
	}
	if len(mine) == 0 {
		return out
	}
	// The fair targets over every live instance: the others' demands count,
	// so that a replica leaves the others' fair shares to them.
	demands := make([]int64, len(live))
	at := make([]int, len(claims)) // a claim's position in live
	for k, i := range live {
		demands[k] = claims[i].Demand
		at[i] = k
	}
	targets := waterfill(limit, demands, claims, live)
	// Fit the caller's targets into what the others leave.
	room := max(limit-others, 0)
	want := make([]int64, len(mine))
	var sum int64
	for k, i := range mine {
		want[k] = targets[at[i]]
		sum += want[k]
	}
	if sum > room {
		want = waterfill(room, want, claims, mine)
	}
	// Stability: keep a held share within tolerance of its new value, if
	// the budget still holds it; failing that, apply the decreases.
	keep := func(k int, decreases bool) bool {
		c := &claims[mine[k]]
		h := c.held(now)
		if h <= 0 || want[k] <= 0 || (!decreases && h > want[k]) {
			return false
		}
		return math.Abs(float64(h-want[k])) <= tolerance*float64(want[k])
	}
	for _, decreases := range []bool{true, false} {
		total := others
		for k, i := range mine {
			if keep(k, decreases) {
				out[i] = claims[i].held(now)
			} else {
				out[i] = want[k]
			}
			total += out[i]
		}
		if total <= limit {
			break
		}
	}
	return out
}

// waterfill splits budget max-min fair among demands (Unknown: unbounded);
// idx maps each demand to its claim, whose ID orders the remainder.
func waterfill(budget int64, demands []int64, claims []Claim, idx []int) []int64 {
	n := len(demands)
	out := make([]int64, n)
	if n == 0 || budget <= 0 {
		return out
	}
	type needOf struct {
		need int64
		k    int
	}
	order := make([]needOf, n)
	for k, d := range demands {
		if d < 0 {
			d = math.MaxInt64
		}
		order[k] = needOf{d, k}
	}
	// By need alone: the order of equal needs does not matter, since when
	// one of them fits in an equal split of what is left, so do the others
	// (left-need over rest-1 is then at least left over rest).
	slices.SortFunc(order, func(a, b needOf) int { return cmp.Compare(a.need, b.need) })
	left := budget
	for j, o := range order {
		rest := int64(n - j)
		if o.need <= left/rest {
			out[o.k] = o.need
			left -= o.need
			continue
		}
		// Everyone from here on needs more than an equal split: split what
		// is left, the remainder one token each in ID order.
		each, extra := left/rest, left%rest
		tail := make([]int, 0, len(order)-j)
		for _, o := range order[j:] {
			out[o.k] = each
			tail = append(tail, o.k)
		}
		if extra > 0 {
			smallest(tail, int(extra), func(a, b int) bool { return claims[idx[a]].ID < claims[idx[b]].ID })
			for _, k := range tail[:extra] {
				out[k]++
			}
		}
		break
	}
	return out
}

// smallest reorders v so that its first n elements are its n smallest by
// less (distinct keys), in no particular order: a quickselect, expected
// linear where a sort of a budget's thousands of IDs is not.
func smallest(v []int, n int, less func(a, b int) bool) {
	lo, hi := 0, len(v) // the n-th smallest is within v[lo:hi]
	for hi-lo > 1 {
		// Median of three as the pivot, moved to the end.
		m := lo + (hi-lo)/2
		if less(v[m], v[lo]) {
			v[m], v[lo] = v[lo], v[m]
		}
		if less(v[hi-1], v[lo]) {
			v[hi-1], v[lo] = v[lo], v[hi-1]
		}
		if less(v[m], v[hi-1]) {
			v[m], v[hi-1] = v[hi-1], v[m]
		}
		p := v[hi-1]
		i := lo
		for j := lo; j < hi-1; j++ {
			if less(v[j], p) {
				v[i], v[j] = v[j], v[i]
				i++
			}
		}
		v[i], v[hi-1] = v[hi-1], v[i]
		// v[lo:i] < p = v[i] < v[i+1:hi]
		switch {
		case i == n || i+1 == n:
			return
		case i > n:
			hi = i
		default:
			lo = i + 1
		}
	}
}
