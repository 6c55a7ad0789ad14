package storetest

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/tiers"
)

// Counts belong to the rule (SPEC §3): a pair's state is keyed by its rule
// and its policy's shape, and new numbers of one shape (a reload, a
// request's own limit) apply to the counts already made.

// window is a one-tier sliding window of limit hits per w, active for ever:
// a Lyft rate_limit.
func window(limit int64, w time.Duration) *tiers.Policy {
	return &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: limit, Window: w, Active: tiers.Unbounded}}}
}

// stack is the penalty pattern with tier 1 of limit l1 and tier 2 active
// for active.
func stack(l1 int64, active time.Duration) *tiers.Policy {
	return &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{
		{Limit: l1, Window: time.Second, Active: tiers.Unbounded},
		{Limit: 10, Window: time.Second, Active: active, Cooldown: 15 * time.Second},
	}}
}

func withHard(h int64) *tiers.Policy {
	p := window(100, time.Minute)
	p.HardLimit = h
	return p
}

func withGlobal(g int64) *tiers.Policy {
	p := window(10, time.Second)
	p.GlobalLimit = g
	return p
}

func tokens(capacity, refill int64, per time.Duration) *tiers.Policy {
	return &tiers.Policy{Kind: tiers.KindTokenBucket, Bucket: tiers.TokenBucket{Capacity: capacity, Refill: refill, Per: per}}
}

func fixedMinute(limit int64) *tiers.Policy {
	return &tiers.Policy{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Limit: limit, Unit: tiers.UnitMinute}}
}

func quota(limit int64, period tiers.Period) *tiers.Policy {
	return &tiers.Policy{Kind: tiers.KindQuota, Quota: tiers.Quota{Limit: limit, Period: period}}
}

// ruleStep is one request of testLimitChanges: hits of domain (all of them
// or nothing) under p at T0+at, and what it must answer (granted and
// remaining -1: not checked; retry 0: not checked; tier 0: not checked).
type ruleStep struct {
	at        time.Duration
	p         *tiers.Policy
	domain    string
	hits      int64
	ok        bool
	remaining int64
	retry     time.Duration
	tier      int
}

// testLimitChanges: each change of numbers the issue lists (a limit raised
// lets exactly the difference through, lowered below the count rejects
// until the count drains; hard and global limits, a bucket's capacity and
// refill, a fixed window's and a quota's limit, active periods, post-paid
// counting) keeps the count made under the old numbers.
func testLimitChanges(t *testing.T, s store.Store) {
	w5, w6, w3 := window(5, time.Minute), window(6, time.Minute), window(3, time.Minute)
	w60, w64, w100 := window(60, time.Hour), window(64, time.Hour), window(100, time.Hour)
	b5, b6, b3 := tokens(5, 2, time.Second), tokens(6, 2, time.Second), tokens(3, 2, time.Second)
	b5slow := tokens(5, 1, time.Second)
	month := T0.Truncate(24*time.Hour).AddDate(0, 0, 1-T0.Day()).AddDate(0, 1, 0).Sub(T0)
	pp5 := postPaid(w5)
	for _, tc := range []struct {
		name  string
		steps []ruleStep
	}{
		{"window raised lets exactly the difference through", []ruleStep{
			{0, w5, "u", 5, true, 0, 0, 0},
			{0, w5, "u", 1, false, 0, 0, 0},
			{time.Second, w6, "u", 1, true, 0, 0, 0},
			{time.Second, w6, "u", 1, false, 0, 0, 0},
		}},
		{"window lowered below the count rejects until it drains", []ruleStep{
			{0, w5, "u", 5, true, 0, 0, 0},
			{time.Second, w3, "u", 1, false, 0, 59 * time.Second, 0},
			{59 * time.Second, w3, "u", 1, false, 0, 0, 0},
			{time.Minute, w3, "u", 3, true, 0, 0, 0},
		}},
		{"window raised across the exact bound keeps its timestamps", []ruleStep{
			{0, w60, "u", 60, true, 0, 0, 0},
			{time.Second, w100, "u", 40, true, 0, 0, 0},
			{time.Second, w100, "u", 1, false, 0, 0, 0},
			{2 * time.Second, w60, "u", 1, false, 0, 0, 0},
			// The first 60 hits leave the window an hour after they were
			// granted, exactly: they were kept as timestamps (the 40 joined
			// the newest of them, T0's, and leave with it).
			{time.Hour, w100, "u", 60, true, 40, 0, 0},
		}},
		{"window lowered across the exact bound rejects", []ruleStep{
			{0, w100, "u", 100, true, 0, 0, 0},
			{time.Second, w64, "u", 1, false, 0, 0, 0},
			{time.Second, w100, "u", 1, false, 0, 0, 0},
		}},
		{"tier raised within a stack grants in the tier, no burst", []ruleStep{
			{0, stack(5, 5*time.Second), "u", 5, true, -1, 0, 1},
			{0, stack(6, 5*time.Second), "u", 1, true, -1, 0, 1},
			{0, stack(6, 5*time.Second), "u", 1, true, -1, 0, 2},
		}},
		{"active period lengthened keeps the tier entered", []ruleStep{
			{0, stack(5, 5*time.Second), "u", 6, true, -1, 0, 2},
			// Under 5 s tier 2 would be in its cooldown at 7 s (a burst
			// refused); under 10 s it is still the current tier.
			{7 * time.Second, stack(5, 10*time.Second), "u", 1, true, -1, 0, 2},
		}},
		{"hard limit raised", []ruleStep{
			{0, withHard(6), "u", 6, true, -1, 0, 0},
			{0, withHard(6), "u", 1, false, -1, 0, 0},
			{100 * time.Millisecond, withHard(8), "u", 2, true, -1, 0, 0},
			{100 * time.Millisecond, withHard(8), "u", 1, false, -1, 0, 0},
		}},
		{"global limit raised", []ruleStep{
			{0, withGlobal(4), "a", 3, true, -1, 0, 0},
			{0, withGlobal(4), "b", 1, true, -1, 0, 0},
			{0, withGlobal(4), "b", 1, false, -1, 0, 0},
			{0, withGlobal(6), "b", 2, true, -1, 0, 0},
			{0, withGlobal(6), "a", 1, false, -1, 0, 0},
		}},
		{"bucket capacity raised", []ruleStep{
			{0, b5, "u", 5, true, 0, 0, 0},
			{0, b6, "u", 1, true, 0, 0, 0},
			{0, b6, "u", 1, false, 0, 0, 0},
		}},
		{"bucket capacity lowered below what it owes", []ruleStep{
			{0, b6, "u", 6, true, 0, 0, 0},
			// 6 owed of 3: a balance of -3, 4 credits at 2/s to one.
			{0, b3, "u", 1, false, 0, 2 * time.Second, 0},
			{2 * time.Second, b3, "u", 1, true, 0, 0, 0},
		}},
		{"bucket refill changed keeps what it owes in whole credits", []ruleStep{
			{0, b5, "u", 5, true, 0, 0, 0},
			// 1.5 credits back at 2/s: one taken, 4.5 owed.
			{750 * time.Millisecond, b5, "u", 1, true, 0, 0, 0},
			// At 1/s the 4.5 owed are 4 (the half credit refilling is
			// dropped): one credit, not a fresh bucket of 5.
			{750 * time.Millisecond, b5slow, "u", 1, true, 0, 0, 0},
			{750 * time.Millisecond, b5slow, "u", 1, false, 0, time.Second, 0},
		}},
		{"fixed window raised", []ruleStep{
			{0, fixedMinute(3), "u", 3, true, 0, 0, 0},
			{0, fixedMinute(4), "u", 1, true, 0, 0, 0},
			{0, fixedMinute(4), "u", 1, false, 0, 0, 0},
			{0, fixedMinute(2), "u", 1, false, 0, 0, 0},
		}},
		{"quota plan raised mid-month leaves the difference", []ruleStep{
			{0, quota(1000, tiers.PeriodMonth), "u", 900, true, 100, 0, 0},
			{time.Hour, quota(5000, tiers.PeriodMonth), "u", 4100, true, 0, 0, 0},
			{time.Hour, quota(5000, tiers.PeriodMonth), "u", 1, false, 0, 0, 0},
		}},
		{"quota plan lowered below the count rejects until the month ends", []ruleStep{
			{0, quota(1000, tiers.PeriodMonth), "u", 900, true, 100, 0, 0},
			{time.Hour, quota(500, tiers.PeriodMonth), "u", 1, false, 0, month - time.Hour, 0},
			{month, quota(500, tiers.PeriodMonth), "u", 500, true, 0, 0, 0},
		}},
		{"post-paid counting selected keeps the count", []ruleStep{
			{0, w5, "u", 3, true, 2, 0, 0},
			{time.Second, pp5, "u", 2, true, 0, 0, 0},
			// Refused and debited: 6 of 5, in debt.
			{time.Second, pp5, "u", 1, false, 0, 0, 0},
			{2 * time.Second, w5, "u", 1, false, 0, 0, 0},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := "rule/" + tc.name
			for i, st := range tc.steps {
				d := Decide(t, s, T0.Add(st.at), take(st.p, res, st.domain, st.hits))[0]
				switch {
				case d.OK != st.ok:
					t.Fatalf("step %d (%d hits at +%v): OK %v, want %v: %+v", i, st.hits, st.at, d.OK, st.ok, d)
				case st.ok && d.Granted != st.hits:
					t.Fatalf("step %d: granted %d, want %d", i, d.Granted, st.hits)
				case st.remaining >= 0 && d.Remaining != st.remaining:
					t.Fatalf("step %d (%d hits at +%v): remaining %d, want %d: %+v", i, st.hits, st.at, d.Remaining, st.remaining, d)
				case st.retry != 0 && d.RetryAfter != st.retry:
					t.Fatalf("step %d (%d hits at +%v): retry after %v, want %v", i, st.hits, st.at, d.RetryAfter, st.retry)
				case st.tier != 0 && d.Tier != st.tier:
					t.Fatalf("step %d (%d hits at +%v): tier %d, want %d: %+v", i, st.hits, st.at, d.Tier, st.tier, d)
				}
			}
		})
	}
}

// counter is the reference of testRandomLimitCounts, written from SPEC §2
// and §3 without package tiers: one count per rule identity (resource and
// domain), whatever limit is in force when a request comes.
type counter struct {
	hits  map[string][]int64 // a sliding window's: the instant (µs) of every hit granted
	start map[string]int64   // a fixed window's or a quota's: its window's start
	count map[string]int64   // and its count
	owed  map[string]int64   // a bucket's: units owed at its last grant
	last  map[string]int64   // and that grant's instant
}

// counterFamily is a rule whose limit each request draws from limits.
type counterFamily struct {
	name   string
	limits []int64
	policy func(limit int64) *tiers.Policy
}

const (
	counterWindow = 2 * time.Second
	// counterRefill is the families' bucket refill: 1 credit a second, a
	// credit of 10^6 units gaining 1 unit per µs.
	counterUnit = int64(1_000_000)
)

var counterFamilies = []counterFamily{
	{"window", []int64{1, 2, 3, 4, 6}, func(l int64) *tiers.Policy { return window(l, counterWindow) }},
	{"fixed", []int64{1, 2, 3, 5}, func(l int64) *tiers.Policy {
		return &tiers.Policy{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Limit: l, Unit: tiers.UnitSecond}}
	}},
	{"bucket", []int64{2, 3, 5, 8}, func(l int64) *tiers.Policy { return tokens(l, 1, time.Second) }},
	{"quota", []int64{3, 5, 8, 13}, func(l int64) *tiers.Policy { return quota(l, tiers.PeriodMinute) }},
}

// decide answers k hits (all or nothing) of family f's pair id under limit
// lim at t (µs): granted, and the remaining.
func (c *counter) decide(f string, id string, lim, k, t int64) (bool, int64) {
	switch f {
	case "window":
		w := tiers.Micros(counterWindow)
		live := c.hits[id][:0]
		for _, h := range c.hits[id] {
			if t-h < w {
				live = append(live, h)
			}
		}
		c.hits[id] = live
		n := int64(len(live))
		if n+k > lim {
			return false, max(0, lim-n)
		}
		for range k {
			c.hits[id] = append(c.hits[id], t)
		}
		return true, lim - n - k
	case "fixed", "quota":
		length := int64(1_000_000)
		if f == "quota" {
			length = 60_000_000
		}
		start := t - t%length
		if c.start[id] != start {
			c.start[id], c.count[id] = start, 0
		}
		n := c.count[id]
		if n+k > lim {
			return false, max(0, lim-n)
		}
		c.count[id] = n + k
		return true, lim - n - k
	default: // bucket
		capU := lim * counterUnit
		owed := c.owed[id]
		if _, ok := c.last[id]; ok {
			// What it owes, never more than twice the capacity, repaid
			// at 1 unit per µs since its last grant.
			owed = max(0, min(owed, 2*capU)-(t-c.last[id]))
		}
		b := capU - owed
		if b < k*counterUnit {
			return false, max(0, b) / counterUnit
		}
		c.owed[id], c.last[id] = owed+k*counterUnit, t
		return true, (b - k*counterUnit) / counterUnit
	}
}

// testRandomLimitCounts replays random single requests of the families'
// rules, each under a limit drawn for it (a reload or a request's own
// limit between any two requests), and demands the answers of counter,
// which keeps one count per rule identity: a raised limit lets exactly the
// difference through, a lowered one rejects until the count drains.
func testRandomLimitCounts(t *testing.T, s store.Store) {
	for _, seed := range []uint64{1, 2, 3} {
		r := rand.New(rand.NewPCG(seed, 40))
		c := counter{hits: map[string][]int64{}, start: map[string]int64{}, count: map[string]int64{},
			owed: map[string]int64{}, last: map[string]int64{}}
		now := T0
		for step := range 1500 {
			now = now.Add(time.Duration(r.IntN(250)) * time.Millisecond)
			f := counterFamilies[r.IntN(len(counterFamilies))]
			lim := f.limits[r.IntN(len(f.limits))]
			dom := fmt.Sprint("d", r.IntN(2))
			k := int64(1 + r.IntN(3))
			res := fmt.Sprintf("counts/%d/%s", seed, f.name)
			d := Decide(t, s, now, take(f.policy(lim), res, dom, k))[0]
			ok, rem := c.decide(f.name, res+"/"+dom, lim, k, now.UnixMicro())
			if d.OK != ok || (ok && d.Granted != k) || d.Remaining != rem {
				t.Fatalf("seed %d step %d: %s %s, %d hits under limit %d at +%v: OK %v granted %d remaining %d; one count per rule: OK %v remaining %d",
					seed, step, f.name, dom, k, lim, now.Sub(T0), d.OK, d.Granted, d.Remaining, ok, rem)
			}
		}
	}
}

// testRandomLimitChanges replays random traces of calls (several items,
// refunds, shadow items, post-paid ones) whose rules change their numbers
// from call to call within one shape, against the model store: every store
// keeps one state per rule and reads it under the numbers in force.
func testRandomLimitChanges(t *testing.T, s store.Store) {
	var stacks, hards, globals, buckets, bigs, fixeds, quotas, mixed []*tiers.Policy
	for _, l1 := range []int64{3, 5, 6} {
		for _, active := range []time.Duration{3 * time.Second, 5 * time.Second} {
			p := stack(l1, active)
			p.Tiers[1].Limit = 4 + 2*l1
			p.Tiers[1].Cooldown = 2 * active
			stacks = append(stacks, p)
		}
	}
	for _, h := range []int64{4, 6, 9} {
		p := withHard(h)
		p.Tiers[0].Limit, p.Tiers[0].Window = 3+h, 2*time.Second
		hards = append(hards, p)
	}
	for _, g := range []int64{3, 4, 6, 70} {
		globals = append(globals, withGlobal(g))
	}
	for _, b := range [][3]int64{{3, 1, 1000}, {5, 2, 1000}, {8, 3, 500}, {5, 7, 1500}} {
		buckets = append(buckets, tokens(b[0], b[1], time.Duration(b[2])*time.Millisecond))
	}
	for _, l := range []int64{40, 64, 65, 200} {
		bigs = append(bigs, window(l, time.Minute))
	}
	for _, l := range []int64{2, 3, 5} {
		fixeds = append(fixeds, &tiers.Policy{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Limit: l, Unit: tiers.UnitSecond}})
		quotas = append(quotas, quota(6*l, tiers.PeriodMinute))
		mixed = append(mixed, window(l, time.Second), postPaid(window(l, time.Second)))
	}
	variants := [][]*tiers.Policy{stacks, hards, globals, buckets, bigs, fixeds, quotas, mixed}
	tr := Trace{Seed: 44, Steps: 2500, Gap: 300 * time.Millisecond, Items: 4, Domains: 3, Variants: variants}
	for _, v := range variants {
		tr.Policies = append(tr.Policies, v[0])
	}
	tr.Replay(t, s, &Model{}, func(step int, now time.Time, items []store.Item, got, want []tiers.Decision) {
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("step %d at +%v, items %+v (-model +store):\n%s", step, now.Sub(T0), items, diff)
		}
	})
}
