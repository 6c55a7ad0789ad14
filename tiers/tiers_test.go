package tiers

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var t0 = time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)

type step struct {
	at        time.Duration
	copies    int64
	min       int64
	want      Decision
	wantWhole bool // compare the whole decision, else only Granted/OK/Tier
}

func runSteps(t *testing.T, p *Policy, steps []step) {
	t.Helper()
	var s State
	var g Global
	for i, st := range steps {
		m := st.min
		if m == 0 {
			m = 1
		}
		now := t0.Add(st.at)
		peek := Peek(p, &s, &g, now, st.copies, m)
		got := Request(p, &s, &g, now, st.copies, m)
		if diff := cmp.Diff(peek, got); diff != "" {
			t.Fatalf("step %d: Peek and Request differ (-peek +request):\n%s", i, diff)
		}
		if !st.wantWhole {
			got = Decision{Granted: got.Granted, OK: got.OK, Tier: got.Tier}
		}
		if diff := cmp.Diff(st.want, got); diff != "" {
			t.Errorf("step %d at %v: decision (-want +got):\n%s", i, st.at, diff)
		}
	}
}

func TestSimpleTier(t *testing.T) {
	p := &Policy{Tiers: []Tier{{Limit: 2, Window: time.Second, Active: Unbounded}}}
	ms := time.Millisecond
	runSteps(t, p, []step{
		{at: 0, copies: 1, wantWhole: true, want: Decision{Granted: 1, OK: true, Tier: 1, TierLimit: 2, TierWindow: time.Second,
			TierHits: 1, DomainHits: 1, ResourceHits: 1, Burst: true, Remaining: 1, ResetAfter: time.Second}},
		{at: 100 * ms, copies: 1, wantWhole: true, want: Decision{Granted: 1, OK: true, Tier: 1, TierLimit: 2, TierWindow: time.Second,
			TierHits: 2, DomainHits: 2, ResourceHits: 2, Remaining: 0, ResetAfter: 900 * ms}},
		{at: 500 * ms, copies: 1, wantWhole: true, want: Decision{Tier: 1, TierLimit: 2, TierWindow: time.Second,
			TierHits: 2, DomainHits: 2, ResourceHits: 2, RetryAfter: 500 * ms, ResetAfter: 500 * ms}},
		{at: 1000 * ms, copies: 1, want: Decision{Granted: 1, OK: true, Tier: 1}}, // the first hit left exactly W later
		{at: 1050 * ms, copies: 1, want: Decision{Tier: 1}},
		{at: 1100 * ms, copies: 3, min: 1, wantWhole: true, want: Decision{Granted: 1, OK: true, Tier: 1, TierLimit: 2, TierWindow: time.Second,
			TierHits: 2, DomainHits: 2, ResourceHits: 2, Remaining: 0, ResetAfter: 900 * ms}},
	})
}

func TestPenaltiesStep(t *testing.T) {
	p := &Policy{Tiers: []Tier{
		{Limit: 1, Window: time.Second, Active: Unbounded},
		{Limit: 3, Window: time.Second, Active: 5 * time.Second, Cooldown: 15 * time.Second},
	}}
	runSteps(t, p, []step{
		{at: 0, copies: 1, want: Decision{Granted: 1, OK: true, Tier: 1}},
		{at: 0, copies: 2, want: Decision{Granted: 2, OK: true, Tier: 2}},
		{at: 0, copies: 2, min: 2, want: Decision{Tier: 2}},
		{at: 0, copies: 2, min: 1, want: Decision{Granted: 1, OK: true, Tier: 2}},
		{at: 4 * time.Second, copies: 5, min: 1, want: Decision{Granted: 3, OK: true, Tier: 2}},
		{at: 5 * time.Second, copies: 5, min: 1, want: Decision{Granted: 1, OK: true, Tier: 1}}, // fallback; tier 2 in cooldown
		{at: 5500 * time.Millisecond, copies: 1, want: Decision{Tier: 1}},
		{at: 20 * time.Second, copies: 5, min: 1, want: Decision{Granted: 4, OK: true, Tier: 2}},
	})
}

func TestRetryAfterWaitsForCooldown(t *testing.T) {
	// Batch: one tier entered, filled, then cooldown: retry is entry+A+C.
	p := &Policy{Tiers: []Tier{{Limit: 3, Window: 10 * time.Second, Active: 10 * time.Second, Cooldown: 50 * time.Second}}}
	var s State
	Request(p, &s, nil, t0, 3, 3)
	d := Request(p, &s, nil, t0.Add(2*time.Second), 1, 1)
	if d.OK || d.RetryAfter != 58*time.Second {
		t.Fatalf("got OK %v retry %v, want rejected, retry 58s", d.OK, d.RetryAfter)
	}
	if got := ForgetAt(p, &s); !got.Equal(t0.Add(60 * time.Second)) {
		t.Errorf("ForgetAt = %v, want %v", got, t0.Add(60*time.Second))
	}
}

func TestClosedAndImpossible(t *testing.T) {
	var s State
	d := Request(&Policy{}, &s, nil, t0, 1, 1)
	if d.OK || d.RetryAfter != Unbounded {
		t.Errorf("no tiers: got %+v, want rejected, RetryAfter Unbounded", d)
	}
	p := &Policy{HardLimit: 2, Tiers: []Tier{{Limit: 10, Window: time.Second, Active: Unbounded}}}
	d = Request(p, &s, nil, t0, 3, 3)
	if d.OK || d.RetryAfter != Unbounded || !d.LimitedByHard || d.Remaining != 2 {
		t.Errorf("min above hard limit: got %+v", d)
	}
	d = Request(p, &s, nil, t0, 1, 2)
	if d.OK || d.RetryAfter != Unbounded {
		t.Errorf("min above copies: got %+v", d)
	}
	d = Request(p, &s, nil, t0, 0, 0)
	if !d.OK || d.Granted != 0 || d.Remaining != 2 {
		t.Errorf("query: got %+v", d)
	}
	if !ForgetAt(p, &s).IsZero() {
		t.Errorf("nothing granted: ForgetAt = %v, want zero", ForgetAt(p, &s))
	}
	if d := Request(nil, nil, nil, t0, 1, 1); d.OK {
		t.Errorf("nil policy granted")
	}
}
