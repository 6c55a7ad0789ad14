package storetest

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/tiers"
	"github.com/charonlimit/charon/tiers/tierstest"
)

// calendar is the least common multiple of the fixed-window units'
// lengths (15,330 days): moving a script by whole calendars keeps its
// fixed windows aligned as they were.
var calendar = func() time.Duration {
	gcd := func(a, b time.Duration) time.Duration {
		for b != 0 {
			a, b = b, a%b
		}
		return a
	}
	l := time.Second
	for u := tiers.UnitSecond; u.Length() != 0; u++ {
		l = l / gcd(l, u.Length()) * u.Length()
	}
	return l
}()

// testScenarios replays package tiers' scenario scripts (tiers/testdata,
// read by tierstest), each on a resource of its own, one item per call: a
// request asks for its copies and min, a refund is a refund item. Every
// answer must be what tiers gives on states of its own (one per domain,
// and one Global when the policy has a global limit, as the stores keep
// them), and meet the script's expectations. The scripts' times are moved
// by whole calendars to T0 or later, so that a store that expires keys on
// a real clock keeps them. ForgetAt steps are left to the tiers replay:
// a store does not report its forgetting time (ForgetTime checks it).
func testScenarios(t *testing.T, s store.Store) {
	dir, err := tierstest.Dir()
	if err != nil {
		t.Fatal(err)
	}
	scripts, err := tierstest.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, sc := range scripts {
		t.Run(sc.Name, func(t *testing.T) {
			var shift time.Duration
			for sc.Start.Add(shift).Before(T0) {
				shift += calendar
			}
			p := &sc.Policy
			states := map[string]*tiers.State{}
			var g *tiers.Global
			if p.GlobalLimit > 0 {
				g = &tiers.Global{}
			}
			for _, st := range sc.Steps {
				ts := states[st.Domain]
				if ts == nil {
					ts = &tiers.State{}
					states[st.Domain] = ts
				}
				now := st.At.Add(shift)
				it := store.Item{Key: store.Key{Resource: "scenario/" + sc.Name, Domain: st.Domain, PolicyID: 1}, Policy: p, Hits: st.Copies}
				var want tiers.Decision
				switch {
				case st.Op == tierstest.OpForget || st.Copies < 1:
					continue // no store item asks for nothing
				case st.Op == tierstest.OpRefund:
					it.Refund = true
					if !st.SlotsAt.IsZero() {
						it.SlotsAt = st.SlotsAt.Add(shift)
					}
					tiers.RefundSlots(p, ts, g, now, it.SlotsAt, st.Copies)
					want = tiers.Peek(p, ts, g, now, 1, 1)
					want.Granted, want.OK, want.SlotsAt = 0, true, time.Time{}
				default:
					// A store item's min is at least 1; a script's min 0
					// only changes the answer when nothing is granted.
					it.Min = max(st.Min, 1)
					want = tiers.Request(p, ts, g, now, st.Copies, it.Min)
				}
				got := Decide(t, s, now, it)[0]
				if diff := cmp.Diff(want, got); diff != "" {
					t.Fatalf("%s: decision (-tiers +store):\n%s", st.Where, diff)
				}
				if st.Op == tierstest.OpRequest && st.Min >= 1 {
					for _, msg := range st.Check(got) {
						t.Errorf("%s: %s (decision %+v)", st.Where, msg, got)
					}
				}
			}
		})
	}
}
