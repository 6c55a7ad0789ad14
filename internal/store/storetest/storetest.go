package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/tiers"
)

// T0 is the instant the suite's traces start from.
var T0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// Run runs the conformance suite against stores made by newStore, one fresh,
// empty store per subtest. The suite closes each store at the end of its
// subtest.
func Run(t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Helper()
	tests := []struct {
		name string
		fn   func(t *testing.T, s store.Store)
	}{
		{"SequencesMatchTiers", testSequences},
		{"AllOrNothing", testAllOrNothing},
		{"ShadowItems", testShadow},
		{"Refunds", testRefunds},
		{"Checks", testChecks},
		{"SameKeyTwice", testSameKeyTwice},
		{"GlobalSharedAcrossDomains", testGlobal},
		{"GlobalPartialGrants", testGlobalPartial},
		{"ShapeChangeIsFreshState", testPolicyID},
		{"LimitChangesKeepCounts", testLimitChanges},
		{"RandomLimitChangesMatchCounts", testRandomLimitCounts},
		{"RandomLimitChangesMatchModel", testRandomLimitChanges},
		{"ForgetTime", testForget},
		{"BadItems", testBadItems},
		{"Close", testClose},
		{"ConcurrentSingleKey", testConcurrentSingle},
		{"ConcurrentAllOrNothing", testConcurrentMulti},
		{"ConcurrentGlobal", testConcurrentGlobal},
		{"RandomTracesMatchModel", testRandomTraces},
		{"Scenarios", testScenarios},
		{"InspectAndReset", testInspect},
		{"PostPaid", testPostPaid},
		{"RandomTracesPostPaid", testRandomTracesPostPaid},
		{"PaceTracesMatchModel", testPaceTraces},
		{"PaceConcurrent", testPaceConcurrent},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newStore(t)
			t.Cleanup(func() { s.Close() })
			tt.fn(t, s)
		})
	}
}

// Policies used by the suite.
var (
	simple   = &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 3, Window: time.Second, Active: tiers.Unbounded}}}
	hourly   = &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 50, Window: time.Hour, Active: tiers.Unbounded}}}
	big      = &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 1000, Window: time.Hour, Active: tiers.Unbounded}}}
	penalty  = &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 5, Window: time.Second, Active: tiers.Unbounded}, {Limit: 10, Window: time.Second, Active: 5 * time.Second, Cooldown: 15 * time.Second}}}
	hard     = &tiers.Policy{Kind: tiers.KindTiers, HardLimit: 6, Tiers: []tiers.Tier{{Limit: 4, Window: time.Second, Active: tiers.Unbounded}, {Limit: 8, Window: 2 * time.Second, Active: 4 * time.Second, Cooldown: 2 * time.Second, Skippable: true}, {Limit: 12, Window: 2 * time.Second, Active: 8 * time.Second, Cooldown: 8 * time.Second}}}
	global   = &tiers.Policy{Kind: tiers.KindTiers, GlobalLimit: 4, Tiers: []tiers.Tier{{Limit: 10, Window: time.Second, Active: tiers.Unbounded}}}
	global30 = &tiers.Policy{Kind: tiers.KindTiers, GlobalLimit: 30, Tiers: []tiers.Tier{{Limit: 1000, Window: time.Hour, Active: tiers.Unbounded}}}
	bucket   = &tiers.Policy{Kind: tiers.KindTokenBucket, Bucket: tiers.TokenBucket{Capacity: 5, Refill: 2, Per: time.Second}}
	fixed    = &tiers.Policy{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Limit: 3, Unit: tiers.UnitSecond}}
	fixed0   = &tiers.Policy{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Limit: 0, Unit: tiers.UnitMinute}} // requests_per_unit: 0
	closed   = &tiers.Policy{Kind: tiers.KindTiers}
)

// postPaid returns p with post-paid counting (Overdraft).
func postPaid(p *tiers.Policy) *tiers.Policy {
	c := *p
	c.Overdraft = true
	return &c
}

func take(p *tiers.Policy, resource, domain string, hits int64) store.Item {
	return store.Item{Key: store.Key{Resource: resource, Domain: domain, PolicyID: 1}, Policy: p, Hits: hits, Min: hits}
}

func refund(p *tiers.Policy, resource, domain string, hits int64) store.Item {
	it := take(p, resource, domain, hits)
	it.Refund = true
	return it
}

func shadow(it store.Item) store.Item {
	it.Shadow = true
	return it
}

// Decide decides items on s at now and returns their decisions, failing
// the test on an error: the helper of the suite and of stores' own tests.
func Decide(t testing.TB, s store.Store, now time.Time, items ...store.Item) []tiers.Decision {
	t.Helper()
	out := make([]tiers.Decision, len(items))
	if err := s.Decide(context.Background(), now, items, out); err != nil {
		t.Fatalf("Decide(%v): %v", items, err)
	}
	return out
}

func oks(ds []tiers.Decision) []bool {
	r := make([]bool, len(ds))
	for i, d := range ds {
		r[i] = d.OK
	}
	return r
}

func wantOKs(t *testing.T, what string, ds []tiers.Decision, want ...bool) {
	t.Helper()
	if diff := cmp.Diff(want, oks(ds)); diff != "" {
		t.Fatalf("%s: OK per item (-want +got):\n%s\ndecisions: %+v", what, diff, ds)
	}
}

// testSequences replays seeded random single-item traces and demands the
// decisions tiers.Request gives on a state of its own.
func testSequences(t *testing.T, s store.Store) {
	policies := []struct {
		name string
		p    *tiers.Policy
	}{{"simple", simple}, {"penalty", penalty}, {"hard", hard}, {"global", global}, {"bucket", bucket}, {"fixed", fixed}, {"closed", closed}}
	for pi, pc := range policies {
		r := rand.New(rand.NewPCG(uint64(pi), 7))
		var st tiers.State
		var g tiers.Global
		gp := &g
		if pc.p.GlobalLimit == 0 {
			gp = nil
		}
		now := T0
		granted, rejected := 0, 0
		for step := range 400 {
			now = now.Add(time.Duration(r.IntN(400)) * time.Millisecond)
			hits := int64(1 + r.IntN(3))
			min := int64(1 + r.IntN(int(hits)))
			it := take(pc.p, "seq/"+pc.name, "d", hits)
			it.Min = min
			got := Decide(t, s, now, it)[0]
			want := tiers.Request(pc.p, &st, gp, now, hits, min)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Fatalf("%s step %d at +%v, request(%d, %d): decision (-tiers +store):\n%s", pc.name, step, now.Sub(T0), hits, min, diff)
			}
			if got.OK {
				granted++
			} else {
				rejected++
			}
		}
		if pc.p != closed && (granted == 0 || rejected == 0) {
			t.Errorf("%s: %d granted, %d rejected: the trace should see both", pc.name, granted, rejected)
		}
	}
}

func testAllOrNothing(t *testing.T, s store.Store) {
	wantOKs(t, "exhaust b", Decide(t, s, T0, take(simple, "r", "b", 3)), true)
	var fresh tiers.State
	wantPeek := tiers.Peek(simple, &fresh, nil, T0, 1, 1)
	got := Decide(t, s, T0, take(simple, "r", "a", 1), take(simple, "r", "b", 1))
	wantOKs(t, "a and b", got, true, false)
	if diff := cmp.Diff(wantPeek, got[0]); diff != "" {
		t.Errorf("uncommitted item's answer is not tiers.Peek (-want +got):\n%s", diff)
	}
	if got[1].Granted != 0 {
		t.Errorf("rejected item granted %d, want 0", got[1].Granted)
	}
	// Nothing was taken from a: all three hits are still there.
	wantOKs(t, "a, 3 hits", Decide(t, s, T0, take(simple, "r", "a", 3)), true)
	wantOKs(t, "a, one more", Decide(t, s, T0, take(simple, "r", "a", 1)), false)
}

func testShadow(t *testing.T, s store.Store) {
	wantOKs(t, "exhaust a", Decide(t, s, T0, take(simple, "r", "a", 3)), true)
	// A rejected shadow item does not stop the others.
	wantOKs(t, "shadow a, b", Decide(t, s, T0, shadow(take(simple, "r", "a", 1)), take(simple, "r", "b", 1)), false, true)
	wantOKs(t, "b took one", Decide(t, s, T0, take(simple, "r", "b", 3)), false)
	wantOKs(t, "b has two", Decide(t, s, T0, take(simple, "r", "b", 2)), true)
	// A granted shadow item is committed with the request...
	wantOKs(t, "shadow c, d", Decide(t, s, T0, shadow(take(simple, "r", "c", 2)), take(simple, "r", "d", 1)), true, true)
	wantOKs(t, "c took two", Decide(t, s, T0, take(simple, "r", "c", 2)), false)
	// ...and not without it.
	wantOKs(t, "shadow e, exhausted b", Decide(t, s, T0, shadow(take(simple, "r", "e", 2)), take(simple, "r", "b", 1)), true, false)
	wantOKs(t, "e took nothing", Decide(t, s, T0, take(simple, "r", "e", 3)), true)
}

func testRefunds(t *testing.T, s store.Store) {
	var st tiers.State
	step := func(what string, now time.Time, it store.Item) {
		t.Helper()
		got := Decide(t, s, now, it)[0]
		var want tiers.Decision
		if it.Refund {
			tiers.Refund(it.Policy, &st, nil, now, it.Hits)
			want = tiers.Peek(it.Policy, &st, nil, now, 1, 1)
			want.Granted, want.OK, want.SlotsAt = 0, true, time.Time{}
		} else {
			want = tiers.Request(it.Policy, &st, nil, now, it.Hits, it.Min)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("%s (-want +got):\n%s", what, diff)
		}
	}
	step("take 3", T0, take(simple, "r", "a", 3))
	step("take 1 more", T0, take(simple, "r", "a", 1))
	step("refund 2", T0.Add(100*time.Millisecond), refund(simple, "r", "a", 2))
	step("take 2", T0.Add(200*time.Millisecond), take(simple, "r", "a", 2))
	step("take 1 more", T0.Add(300*time.Millisecond), take(simple, "r", "a", 1))
	step("refund 10", T0.Add(400*time.Millisecond), refund(simple, "r", "a", 10))
	step("take 3", T0.Add(500*time.Millisecond), take(simple, "r", "a", 3))

	// Refunds apply even when the request is rejected.
	wantOKs(t, "exhaust x and y", Decide(t, s, T0, take(simple, "r", "x", 3), take(simple, "r", "y", 3)), true, true)
	got := Decide(t, s, T0, refund(simple, "r", "x", 1), take(simple, "r", "y", 1))
	wantOKs(t, "refund x, take y", got, true, false)
	if got[0].Granted != 0 {
		t.Errorf("refund item Granted = %d, want 0", got[0].Granted)
	}
	wantOKs(t, "x got one back", Decide(t, s, T0, take(simple, "r", "x", 1)), true)
}

// testChecks: an item of 0 hits is a check: granted with the pair's state
// (tiers.Peek of 0), consuming nothing, alone or beside other pairs' items,
// even on an exhausted pair.
func testChecks(t *testing.T, s store.Store) {
	check := func(p *tiers.Policy, d string) store.Item {
		it := take(p, "r", d, 1)
		it.Hits, it.Min = 0, 0
		return it
	}
	var st tiers.State
	want := tiers.Request(simple, &st, nil, T0, 2, 2)
	wantOKs(t, "take 2 of a", Decide(t, s, T0, take(simple, "r", "a", 2)), want.OK)
	want = tiers.Peek(simple, &st, nil, T0, 0, 0)
	got := Decide(t, s, T0, check(simple, "a"))
	if diff := cmp.Diff(want, got[0]); diff != "" {
		t.Errorf("check of a (-want +got):\n%s", diff)
	}
	if !got[0].OK || got[0].Granted != 0 || got[0].Remaining != 1 {
		t.Errorf("check of a: %+v, want OK, nothing granted, 1 remaining", got[0])
	}
	wantOKs(t, "a still has one", Decide(t, s, T0, take(simple, "r", "a", 1)), true)
	wantOKs(t, "check of exhausted a, take b", Decide(t, s, T0, check(simple, "a"), take(simple, "r", "b", 1)), true, true)
	// Beside a take of the same pair, a check is a member of its group and
	// gets the group's answer.
	wantOKs(t, "check and take of exhausted a", Decide(t, s, T0, check(simple, "a"), take(simple, "r", "a", 1)), false, false)
	wantOKs(t, "b took one", Decide(t, s, T0, take(simple, "r", "b", 3)), false)
}

func testSameKeyTwice(t *testing.T, s store.Store) {
	got := Decide(t, s, T0, take(simple, "r", "a", 2), take(simple, "r", "a", 2))
	wantOKs(t, "2+2 of 3", got, false, false)
	got = Decide(t, s, T0, take(simple, "r", "a", 1), take(simple, "r", "a", 2))
	wantOKs(t, "1+2 of 3", got, true, true)
	if got[0].Granted != 1 || got[1].Granted != 2 {
		t.Errorf("granted %d and %d, want 1 and 2", got[0].Granted, got[1].Granted)
	}
	wantOKs(t, "one more", Decide(t, s, T0, take(simple, "r", "a", 1)), false)

	// With minimums, the group's grant is shared first come, first served.
	a, b := take(hourly, "r", "m", 30), take(hourly, "r", "m", 30)
	a.Min, b.Min = 10, 10
	got = Decide(t, s, T0, a, b)
	if got[0].Granted != 30 || got[1].Granted != 20 {
		t.Errorf("granted %d and %d of 50, want 30 and 20", got[0].Granted, got[1].Granted)
	}
}

func testGlobal(t *testing.T, s store.Store) {
	wantOKs(t, "a takes 3 of global 4", Decide(t, s, T0, take(global, "r", "a", 3)), true)
	got := Decide(t, s, T0, take(global, "r", "b", 2))
	wantOKs(t, "b asks 2", got, false)
	if !got[0].LimitedByGlobal {
		t.Errorf("b: LimitedByGlobal false, want true: %+v", got[0])
	}
	wantOKs(t, "b asks 1", Decide(t, s, T0, take(global, "r", "b", 1)), true)
	wantOKs(t, "another resource", Decide(t, s, T0, take(global, "r2", "a", 4)), true)
	// The global state is the resource's, whatever the shape of a
	// domain's policy (PolicyID): a domain under another shape finds it
	// full.
	wantOKs(t, "another shape", Decide(t, s, T0, store.Item{Key: store.Key{Resource: "r", Domain: "a", PolicyID: 2}, Policy: global, Hits: 1, Min: 1}), false)

	// Within one call the items see each other's grants.
	at := T0.Add(10 * time.Second)
	wantOKs(t, "3+2 of global 4", Decide(t, s, at, take(global, "r", "a", 3), take(global, "r", "b", 2)), true, false)
	wantOKs(t, "2+2 of global 4", Decide(t, s, at, take(global, "r", "a", 2), take(global, "r", "b", 2)), true, true)
	wantOKs(t, "c, global full", Decide(t, s, at, take(global, "r", "c", 1)), false)
}

// testGlobalPartial checks that a call's items sharing a global limit answer
// exactly what the same requests made one after another answer.
func testGlobalPartial(t *testing.T, s store.Store) {
	var sa, sb tiers.State
	var g tiers.Global
	now := T0
	for round := range 4 {
		now = now.Add(1100 * time.Millisecond)
		items := []store.Item{take(global, "r", "a", 3), take(global, "r", "b", 3)}
		items[0].Min, items[1].Min = 1, 1
		want := []tiers.Decision{
			tiers.Request(global, &sa, &g, now, 3, 1),
			tiers.Request(global, &sb, &g, now, 3, 1),
		}
		got := Decide(t, s, now, items...)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("round %d (-sequential tiers +store):\n%s", round, diff)
		}
		if got[1].Granted != 1 {
			t.Fatalf("round %d: b granted %d, want 1 (global 4, a took 3)", round, got[1].Granted)
		}
	}
	// A third domain finds no room: the whole call is rejected and commits
	// nothing, where one-by-one requests would have granted the first two.
	now = now.Add(1100 * time.Millisecond)
	items := []store.Item{take(global, "r", "a", 3), take(global, "r", "b", 3), take(global, "r", "c", 2)}
	items[0].Min, items[1].Min, items[2].Min = 1, 1, 1
	got := Decide(t, s, now, items...)
	wantOKs(t, "a, b, c", got, true, true, false)
	if got[0].Granted != 3 || got[1].Granted != 1 || !got[2].LimitedByGlobal {
		t.Errorf("predicted grants %d, %d and c limited by global %v; want 3, 1, true", got[0].Granted, got[1].Granted, got[2].LimitedByGlobal)
	}
	// c's minimum and the others' grants (1 + 3 + 1) exceed the limit of 4:
	// the same call can never be granted.
	if got[2].RetryAfter != tiers.Unbounded || got[2].ResetAfter != tiers.Unbounded {
		t.Errorf("c: retry after %v, reset after %v; want never", got[2].RetryAfter, got[2].ResetAfter)
	}
	wantOKs(t, "nothing was committed", Decide(t, s, now, take(global, "r", "c", 4)), true)
	// A minimum that fits the limit beside the others' grants (2 + 1 of 4)
	// but not beside the hits of the last second (2): once they have left
	// the global window, the call fits. A rejection that says when, not 0.
	now = now.Add(1100 * time.Millisecond)
	wantOKs(t, "x takes 2", Decide(t, s, now, take(global, "r", "x", 2)), true)
	got = Decide(t, s, now, take(global, "r", "a", 1), take(global, "r", "b", 2))
	if got[1].OK || got[1].RetryAfter <= 0 || got[1].RetryAfter > time.Second || got[1].ResetAfter != got[1].RetryAfter {
		t.Errorf("b cut to a rejection by x's 2 and a's 1 of 4: %+v; want rejected, retry after (0, 1s], reset after the same", got[1])
	}
}

// testPolicyID: a pair's state is keyed by its policy's shape (PolicyID):
// under another shape the pair starts afresh.
func testPolicyID(t *testing.T, s store.Store) {
	it := take(simple, "r", "a", 3)
	wantOKs(t, "exhaust under shape 1", Decide(t, s, T0, it), true)
	wantOKs(t, "more under shape 1", Decide(t, s, T0, take(simple, "r", "a", 1)), false)
	it.Key.PolicyID = 2
	wantOKs(t, "fresh under shape 2", Decide(t, s, T0, it), true)
}

func testForget(t *testing.T, s store.Store) {
	for pi, p := range []*tiers.Policy{simple, penalty, bucket, fixed} {
		var st tiers.State
		now := T0
		for range 20 {
			it := take(p, "forget", fmt.Sprint(pi), 2)
			Decide(t, s, now, it)
			tiers.Request(p, &st, nil, now, 2, 2)
			now = now.Add(50 * time.Millisecond)
		}
		at := tiers.ForgetAt(p, &st)
		if at.Before(now) {
			at = now
		}
		at = at.Add(time.Millisecond)
		var fresh tiers.State
		want := tiers.Request(p, &fresh, nil, at, 1, 1)
		got := Decide(t, s, at, take(p, "forget", fmt.Sprint(pi), 1))[0]
		// Burst may differ: a remembered pair may still be in a tier that a
		// fresh pair enters with this very request.
		if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(tiers.Decision{}, "Burst")); diff != "" {
			t.Errorf("policy %d: after the forgetting time, decision differs from a fresh pair's (-want +got):\n%s", pi, diff)
		}
	}
}

func testBadItems(t *testing.T, s store.Store) {
	good := take(simple, "r", "a", 1)
	bad := []store.Item{
		{Key: store.Key{Resource: "r", Domain: "b", PolicyID: 1}, Hits: 1, Min: 1},
		{Key: store.Key{Resource: "r", Domain: "b", PolicyID: 1}, Policy: simple, Hits: -1, Min: 0},
		{Key: store.Key{Resource: "r", Domain: "b", PolicyID: 1}, Policy: simple, Hits: 0, Min: 1},
		{Key: store.Key{Resource: "r", Domain: "b", PolicyID: 1}, Policy: simple, Hits: 1, Min: 2},
		{Key: store.Key{Resource: "r", Domain: "b", PolicyID: 1}, Policy: simple, Hits: 2, Min: 0},
	}
	for i, b := range bad {
		out := make([]tiers.Decision, 2)
		err := s.Decide(context.Background(), T0, []store.Item{good, b}, out)
		if !errors.Is(err, store.ErrBadItem) {
			t.Errorf("bad item %d: err = %v, want store.ErrBadItem", i, err)
		}
	}
	// Fewer decisions than items: refused, not a panic.
	if err := s.Decide(context.Background(), T0, []store.Item{good, good}, make([]tiers.Decision, 1)); !errors.Is(err, store.ErrBadItem) {
		t.Errorf("short out: err = %v, want store.ErrBadItem", err)
	}
	wantOKs(t, "a untouched", Decide(t, s, T0, take(simple, "r", "a", 3)), true)
}

func testClose(t *testing.T, s store.Store) {
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	out := make([]tiers.Decision, 1)
	if err := s.Decide(context.Background(), T0, []store.Item{take(simple, "r", "a", 1)}, out); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Decide after Close: err = %v, want store.ErrClosed", err)
	}
}

const workers, calls = 8, 25

func testConcurrentSingle(t *testing.T, s store.Store) {
	grants := runWorkers(t, s, func(w, c int) []store.Item { return []store.Item{take(hourly, "r", "hot", 1)} })
	if sum := sum(grants); sum != 50 {
		t.Fatalf("%d grants from %d requests on a limit of 50, want exactly 50", sum, workers*calls)
	}
}

func testConcurrentMulti(t *testing.T, s store.Store) {
	grants := runWorkers(t, s, func(w, c int) []store.Item {
		return []store.Item{take(big, "r", fmt.Sprint("own", w), 1), take(hourly, "r", "hot", 1)}
	})
	if sum := sum(grants); sum != 50 {
		t.Fatalf("%d grants on a limit of 50, want exactly 50", sum)
	}
	// Each worker's own key lost exactly the hits of its granted requests.
	for w, n := range grants {
		left := int64(1000 - n)
		if left > 0 {
			wantOKs(t, fmt.Sprint("worker ", w, " takes the rest"), Decide(t, s, T0, take(big, "r", fmt.Sprint("own", w), left)), true)
		}
		wantOKs(t, fmt.Sprint("worker ", w, " one more"), Decide(t, s, T0, take(big, "r", fmt.Sprint("own", w), 1)), false)
	}
}

func testConcurrentGlobal(t *testing.T, s store.Store) {
	grants := runWorkers(t, s, func(w, c int) []store.Item { return []store.Item{take(global30, "r", fmt.Sprint("d", w), 1)} })
	if sum := sum(grants); sum != 30 {
		t.Fatalf("%d grants over all domains on a global limit of 30, want exactly 30", sum)
	}
}

// runWorkers runs workers goroutines making calls requests each at T0 and
// returns, per worker, how many were granted.
func runWorkers(t *testing.T, s store.Store, items func(w, c int) []store.Item) []int {
	t.Helper()
	grants := make([]int, workers)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := range calls {
				its := items(w, c)
				out := make([]tiers.Decision, len(its))
				if err := s.Decide(context.Background(), T0, its, out); err != nil {
					errs <- err
					return
				}
				all := true
				for _, d := range out[:len(its)] {
					all = all && d.OK
				}
				if all {
					grants[w]++
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("Decide: %v", err)
	}
	return grants
}

func sum(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}

func testRandomTraces(t *testing.T, s store.Store) {
	tr := Trace{Seed: 42, Steps: 1500, Gap: 300 * time.Millisecond, Items: 4, Domains: 3,
		Policies: []*tiers.Policy{simple, penalty, hard, global, bucket, fixed, fixed0}}
	tr.Replay(t, s, &Model{}, func(step int, now time.Time, items []store.Item, got, want []tiers.Decision) {
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("step %d at +%v, items %+v (-model +store):\n%s", step, now.Sub(T0), items, diff)
		}
	})
}

// testPostPaid: a budget paid after the fact (a check of 0 hits, then the
// usage reported) is exhausted by the report that overdraws it, which then
// refuses every request, the next check included; and in a request of
// several pairs, a post-paid pair is debited when another refuses the
// request, while an admission pair consumes nothing.
func testPostPaid(t *testing.T, s store.Store) {
	minute := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 5, Window: time.Minute, Active: tiers.Unbounded}}}
	for _, p := range []*tiers.Policy{postPaid(minute), postPaid(&tiers.Policy{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Limit: 5, Unit: tiers.UnitMinute}}),
		postPaid(&tiers.Policy{Kind: tiers.KindTokenBucket, Bucket: tiers.TokenBucket{Capacity: 5, Refill: 5, Per: time.Minute}})} {
		res := "budget-" + p.Kind.String()
		check := take(p, res, "u", 0)
		check.Min = 0
		now := T0.Truncate(time.Minute)
		steps := []struct {
			it        store.Item
			ok        bool
			remaining int64
		}{
			{check, true, 5},
			{take(p, res, "u", 4), true, 1},
			{take(p, res, "u", 4), false, 0},
			{check, false, 0},
			{take(p, res, "u", 1), false, 0},
			{check, false, 0},
		}
		for i, st := range steps {
			now = now.Add(time.Second)
			got := Decide(t, s, now, st.it)
			if got[0].OK != st.ok || got[0].Remaining != st.remaining {
				t.Errorf("%s step %d (%d hits): OK %v remaining %d, want OK %v remaining %d", res, i, st.it.Hits, got[0].OK, got[0].Remaining, st.ok, st.remaining)
			}
		}
	}

	// An admission pair beside a refused post-paid pair consumes nothing;
	// the post-paid pair is debited whatever the other answers.
	pp := postPaid(simple)
	got := Decide(t, s, T0, take(pp, "mix", "a", 4), take(simple, "adm", "a", 2))
	wantOKs(t, "4 post-paid of 3 and 2 of 3", got, false, true) // the second's answer is its prediction
	wantOKs(t, "the admission pair kept its 3", Decide(t, s, T0, take(simple, "adm", "a", 3)), true)
	wantOKs(t, "the post-paid pair owes", Decide(t, s, T0, take(pp, "mix", "a", 0)), false)
	got = Decide(t, s, T0, take(simple, "adm", "b", 4), take(pp, "mix", "b", 2))
	wantOKs(t, "an admission refusal beside 2 post-paid of 3", got, false, true)
	got = Decide(t, s, T0, take(pp, "mix", "b", 2))
	if got[0].OK || got[0].TierHits != 2 {
		t.Errorf("after 2 debited and 2 more asked: %+v, want a refusal counting 2 hits", got[0])
	}
}

// testRandomTracesPostPaid replays a random trace over post-paid policies
// and admission ones mixed, and demands the model's decisions.
func testRandomTracesPostPaid(t *testing.T, s store.Store) {
	tr := Trace{Seed: 43, Steps: 1500, Gap: 300 * time.Millisecond, Items: 4, Domains: 3,
		Policies: []*tiers.Policy{postPaid(simple), postPaid(penalty), postPaid(hard), postPaid(global), postPaid(bucket), postPaid(fixed), simple, global}}
	tr.Replay(t, s, &Model{}, func(step int, now time.Time, items []store.Item, got, want []tiers.Decision) {
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("step %d at +%v, items %+v (-model +store):\n%s", step, now.Sub(T0), items, diff)
		}
	})
}
