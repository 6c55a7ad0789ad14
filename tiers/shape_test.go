package tiers

import (
	"testing"
	"time"
)

// TestShape: the numbers of a policy leave its shape alone; its windows,
// tier count, kind, unit, period, zone, anchor and whether it has a global
// limit do not.
func TestShape(t *testing.T) {
	one := func(l int64, w time.Duration) *Policy {
		return &Policy{Tiers: []Tier{{Limit: l, Window: w, Active: Unbounded}}}
	}
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Fatal(err)
	}
	base := &Policy{HardLimit: 3, GlobalLimit: 10, Tiers: []Tier{
		{Limit: 5, Window: time.Second, Active: Unbounded},
		{Limit: 9, Window: time.Second, Active: 5 * time.Second, Cooldown: 10 * time.Second},
	}}
	renumbered := &Policy{HardLimit: 70, GlobalLimit: 1000, Overdraft: true, Tiers: []Tier{
		{Limit: 500, Window: time.Second, Active: Unbounded},
		{Limit: 2, Window: time.Second, Active: time.Minute, Cooldown: 0, Skippable: true},
	}}
	bucket := &Policy{Kind: KindTokenBucket, Bucket: TokenBucket{Capacity: 5, Refill: 2, Per: time.Second}}
	fixed := &Policy{Kind: KindFixedWindow, Window: FixedWindow{Limit: 5, Unit: UnitMinute}}
	quota := &Policy{Kind: KindQuota, Quota: Quota{Limit: 1000, Period: PeriodMonth}}
	for _, tc := range []struct {
		name string
		a, b *Policy
		same bool
	}{
		{"a limit", one(5, time.Minute), one(6, time.Minute), true},
		{"across the exact bound", one(64, time.Minute), one(65, time.Minute), true},
		{"every number of a stack", base, renumbered, true},
		{"a window", one(5, time.Minute), one(5, time.Hour), false},
		{"a tier more", base, &Policy{HardLimit: 3, GlobalLimit: 10, Tiers: append(base.Tiers[:2:2], Tier{Limit: 1, Window: time.Second, Active: time.Hour})}, false},
		{"a global limit added", one(5, time.Minute), &Policy{GlobalLimit: 9, Tiers: one(5, time.Minute).Tiers}, false},
		{"a hard limit added", one(5, time.Minute), &Policy{HardLimit: 9, Tiers: one(5, time.Minute).Tiers}, true},
		{"a bucket's numbers", bucket, &Policy{Kind: KindTokenBucket, Bucket: TokenBucket{Capacity: 50, Refill: 7, Per: time.Hour}}, true},
		{"a fixed window's limit", fixed, &Policy{Kind: KindFixedWindow, Window: FixedWindow{Limit: 9, Unit: UnitMinute}}, true},
		{"a fixed window's unit", fixed, &Policy{Kind: KindFixedWindow, Window: FixedWindow{Limit: 5, Unit: UnitHour}}, false},
		{"the algorithm", one(5, time.Minute), fixed, false},
		{"a quota's limit", quota, &Policy{Kind: KindQuota, Quota: Quota{Limit: 5000, Period: PeriodMonth}, Overdraft: true}, true},
		{"a quota's period", quota, &Policy{Kind: KindQuota, Quota: Quota{Limit: 1000, Period: PeriodDay}}, false},
		{"a quota's zone", quota, &Policy{Kind: KindQuota, Quota: Quota{Limit: 1000, Period: PeriodMonth, Location: paris}}, false},
		{"a quota's anchor", quota, &Policy{Kind: KindQuota, Quota: Quota{Limit: 1000, Period: PeriodMonth, Anchor: t0}}, false},
		{"a quota and a fixed window", quota, fixed, false},
		{"nil", nil, one(5, time.Minute), false},
	} {
		if got := tc.a.Shape() == tc.b.Shape(); got != tc.same {
			t.Errorf("%s: same shape %v, want %v", tc.name, got, tc.same)
		}
		if tc.a.Shape() == 0 || tc.b.Shape() == 0 {
			t.Errorf("%s: a shape of 0", tc.name)
		}
	}
	if n := testing.AllocsPerRun(100, func() { base.Shape() }); n != 0 {
		t.Errorf("Shape allocates %v times", n)
	}
}

// TestLimitChangeKeepsState: a state decided under one policy reads under
// another of the same shape with the new numbers applied to its counts
// (SPEC §3): raised, exactly the difference; lowered, rejected until the
// count drains; a log kept exact and one kept in buckets read across the
// exact bound; a bucket keeps what it owes.
func TestLimitChangeKeepsState(t *testing.T) {
	one := func(l int64, w time.Duration) *Policy {
		return &Policy{Tiers: []Tier{{Limit: l, Window: w, Active: Unbounded}}}
	}
	tb := func(c, r int64, per time.Duration) *Policy {
		return &Policy{Kind: KindTokenBucket, Bucket: TokenBucket{Capacity: c, Refill: r, Per: per}}
	}
	type step struct {
		at      time.Duration
		p       *Policy
		k       int64
		ok      bool
		granted int64
		retry   time.Duration // -1: not checked
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"raised", []step{
			{0, one(5, time.Minute), 5, true, 5, -1},
			{time.Second, one(6, time.Minute), 2, false, 0, 59 * time.Second},
			{time.Second, one(6, time.Minute), 1, true, 1, -1},
		}},
		{"lowered", []step{
			{0, one(5, time.Minute), 5, true, 5, -1},
			{time.Second, one(2, time.Minute), 1, false, 0, 59 * time.Second},
			{time.Minute, one(2, time.Minute), 2, true, 2, -1},
		}},
		{"exact to buckets: the timestamps stay exact", []step{
			{0, one(64, time.Hour), 64, true, 64, -1},
			{time.Minute, one(100, time.Hour), 36, true, 36, -1},
			{time.Minute, one(100, time.Hour), 1, false, 0, -1},
			// The 64 leave an hour after they came, to the µs: 64 back.
			{time.Hour - time.Microsecond, one(100, time.Hour), 1, false, 0, -1},
			{time.Hour, one(100, time.Hour), 64, true, 64, -1},
		}},
		{"buckets to exact: the buckets count leniently", []step{
			{0, one(100, time.Hour), 100, true, 100, -1},
			{time.Minute, one(64, time.Hour), 1, false, 0, -1},
			// A bucket of width 56.25 s starting at or before T0 leaves
			// by an hour after it: the 100 leave within (59m03.75s, 1h].
			{time.Hour, one(64, time.Hour), 64, true, 64, -1},
		}},
		{"a bucket's capacity raised, then lowered below what it owes", []step{
			{0, tb(5, 1, time.Second), 5, true, 5, -1},
			{0, tb(7, 1, time.Second), 2, true, 2, -1},
			{0, tb(7, 1, time.Second), 1, false, 0, time.Second},
			// 7 owed of 3, counted as 6 (twice the capacity, the most a
			// bucket owes): a balance of -3, 4 s of refill from a credit.
			{0, tb(3, 1, time.Second), 1, false, 0, 4 * time.Second},
			{4 * time.Second, tb(3, 1, time.Second), 1, true, 1, -1},
		}},
		{"a bucket's refill and period changed", []step{
			{0, tb(10, 1, time.Second), 10, true, 10, -1},
			// 10 owed, now repaid at 3 a minute.
			{0, tb(10, 3, time.Minute), 1, false, 0, 20 * time.Second},
			{20 * time.Second, tb(10, 3, time.Minute), 1, true, 1, -1},
		}},
		{"a bucket owing far more than a lowered capacity owes at most twice it", []step{
			{0, tb(100, 1, time.Second), 100, true, 100, -1},
			{0, tb(2, 1, time.Second), 1, false, 0, 3 * time.Second},
		}},
	} {
		var s State
		for i, st := range tc.steps {
			d := Request(st.p, &s, nil, t0.Add(st.at), st.k, st.k)
			if d.OK != st.ok || d.Granted != st.granted || (st.retry >= 0 && d.RetryAfter != st.retry) {
				t.Fatalf("%s step %d (%d at +%v): %+v; want OK %v granted %d retry %v", tc.name, i, st.k, st.at, d, st.ok, st.granted, st.retry)
			}
		}
	}
}

// TestBucketCompactKeepsUnit: a bucket's compact form carries the unit
// what it owes is kept in, read back under another refill as Request
// reads the state itself.
func TestBucketCompactKeepsUnit(t *testing.T) {
	fast := &Policy{Kind: KindTokenBucket, Bucket: TokenBucket{Capacity: 10, Refill: 2, Per: time.Second}}
	slow := &Policy{Kind: KindTokenBucket, Bucket: TokenBucket{Capacity: 10, Refill: 1, Per: time.Second}}
	var s State
	Request(fast, &s, nil, t0, 10, 10)
	var back State
	if err := back.SetCompact(slow, s.AppendCompact(fast, nil)); err != nil {
		t.Fatal(err)
	}
	at := t0.Add(3 * time.Second)
	if a, b := Peek(slow, &s, nil, at, 10, 1), Peek(slow, &back, nil, at, 10, 1); a != b || a.Granted != 3 {
		t.Errorf("under the slow refill 3 s later: %+v from the state, %+v from its compact form; want 3 granted", a, b)
	}
	if err := back.SetCompact(slow, []int64{1, 1, 5, 2}); err != ErrBadCompact {
		t.Errorf("a bucket's form without its unit: %v, want ErrBadCompact", err)
	}
}
