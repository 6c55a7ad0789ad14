package tiers

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// penalties is the cookbook's penalties pattern: 5 per second, and a burst
// into tier 2 (10 per second) for 5 s, which then cools down for 15 s.
var penalties = &Policy{Tiers: []Tier{
	{Limit: 5, Window: time.Second, Active: Unbounded},
	{Limit: 10, Window: time.Second, Active: 5 * time.Second, Cooldown: 15 * time.Second},
}}

func TestInspectPenalties(t *testing.T) {
	var s State
	var g Global
	for range 8 {
		if d := Request(penalties, &s, &g, t0, 1, 1); !d.OK {
			t.Fatalf("burst of 8 rejected: %+v", d)
		}
	}
	now := t0.Add(3 * time.Second)
	v := Inspect(penalties, &s, &g, now)
	want := View{
		At: now, Kind: KindTiers, Tier: 2,
		Tiers: []TierView{
			{Phase: PhaseActive, EnteredAt: t0, Hits: 0},
			{Phase: PhaseActive, EnteredAt: t0, ActiveUntil: t0.Add(5 * time.Second), CooldownUntil: t0.Add(20 * time.Second)},
		},
		Remaining: 10, Next: t0.Add(5 * time.Second), NextTier: 1,
	}
	if diff := cmp.Diff(want, v); diff != "" {
		t.Errorf("view at 3s (-want +got):\n%s", diff)
	}
	got := v.Summary(penalties)
	for _, w := range []string{"tier 2 of 2 (10 per 1s)", "10 more hits now", "tier 2 cools down in 2s, then tier 1: 5 per 1s"} {
		if !strings.Contains(got, w) {
			t.Errorf("summary %q lacks %q", got, w)
		}
	}

	// In tier 2's cooldown, held to tier 1: a burst cannot enter tier 2.
	now = t0.Add(6 * time.Second)
	for range 5 {
		Request(penalties, &s, &g, now, 1, 1)
	}
	v = Inspect(penalties, &s, &g, now)
	if v.Tier != 1 || v.Tiers[1].Phase != PhaseCooldown || v.Remaining != 0 || v.RetryAfter != time.Second {
		t.Errorf("held to tier 1: got %+v", v)
	}
	got = v.Summary(penalties)
	if !strings.Contains(got, "rejecting for 1s") {
		t.Errorf("summary %q lacks the wait", got)
	}
}

func TestInspectOtherKinds(t *testing.T) {
	bucket := &Policy{Kind: KindTokenBucket, Bucket: TokenBucket{Capacity: 10, Refill: 1, Per: time.Second}}
	var s State
	Request(bucket, &s, nil, t0, 4, 4)
	v := Inspect(bucket, &s, nil, t0.Add(500*time.Millisecond))
	if v.Used != 4 || v.Capacity != 10 || v.Remaining != 6 || !v.Next.Equal(t0.Add(time.Second)) {
		t.Errorf("bucket view: %+v", v)
	}
	if got := v.Summary(bucket); !strings.Contains(got, "4 of 10 credits used: 6 more hits now; next credit in 500ms") {
		t.Errorf("bucket summary: %q", got)
	}
	fixed := &Policy{Kind: KindFixedWindow, Window: FixedWindow{Limit: 3, Unit: UnitMinute}}
	s = State{}
	Request(fixed, &s, nil, t0.Add(10*time.Second), 3, 3)
	v = Inspect(fixed, &s, nil, t0.Add(20*time.Second))
	if v.Used != 3 || v.Remaining != 0 || v.RetryAfter != 40*time.Second || !v.WindowEnd.Equal(t0.Add(time.Minute)) {
		t.Errorf("fixed view: %+v", v)
	}
	if got := v.Summary(fixed); !strings.Contains(got, "3 of 3 used in this minute: rejecting for 40s; the window resets in 40s") {
		t.Errorf("fixed summary: %q", got)
	}
}

// FuzzInspect checks, after a random trace, that Inspect changes nothing,
// that Remaining single requests are then granted and one more is not, that
// a request RetryAfter later is granted, and that the compact form of the
// state reads back as the same state.
func FuzzInspect(f *testing.F) {
	f.Add([]byte{2, 3, 5, 0, 0, 0, 7, 2, 1, 1, 0, 1, 3, 9, 3, 3, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10})
	f.Add([]byte{4, 7, 3, 2, 1, 1, 0, 1, 1, 0, 3, 5, 4, 3, 1, 2, 2, 1, 1, 3, 9, 9, 1, 200, 100, 40, 30, 20, 10, 1, 2, 3})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := &bytesource{b: data}
		p := genPolicy(r, r.next()%2 == 1)
		var s State
		var g Global
		now := t0
		for !r.empty() {
			now = now.Add(time.Duration(r.next()) * 7 * time.Millisecond)
			Request(p, &s, &g, now, int64(r.next()%4), 1)
		}
		before, gBefore := s.AppendCompact(p, nil), g.AppendCompact(nil)
		v := Inspect(p, &s, &g, now)
		if after := s.AppendCompact(p, nil); !slices.Equal(before, after) || !slices.Equal(gBefore, g.AppendCompact(nil)) {
			t.Fatalf("Inspect changed the state: %v -> %v", before, after)
		}
		var back State
		var gBack Global
		if err := back.SetCompact(p, before); err != nil {
			t.Fatalf("SetCompact(%v): %v", before, err)
		}
		if err := gBack.SetCompact(gBefore); err != nil {
			t.Fatalf("Global SetCompact(%v): %v", gBefore, err)
		}
		if vb := Inspect(p, &back, &gBack, now); !cmp.Equal(v, vb) {
			t.Fatalf("the compact form reads back differently:\n%s", cmp.Diff(v, vb))
		}
		if v.Remaining > 0 && v.RetryAfter != 0 || v.Remaining == 0 && v.RetryAfter == 0 {
			t.Fatalf("Remaining %d with RetryAfter %v", v.Remaining, v.RetryAfter)
		}
		if v.RetryAfter > 0 && v.RetryAfter != Unbounded {
			c, cg := cloneState(&s), cloneGlobal(&g)
			if d := Request(p, c, cg, now.Add(v.RetryAfter), 1, 1); !d.OK {
				t.Fatalf("a hit RetryAfter (%v) later was rejected", v.RetryAfter)
			}
		}
		for i := range min(v.Remaining, 300) {
			if d := Request(p, &s, &g, now, 1, 1); !d.OK {
				t.Fatalf("hit %d of Remaining %d rejected", i+1, v.Remaining)
			}
		}
		if v.Remaining <= 300 {
			if d := Request(p, &s, &g, now, 1, 1); d.OK {
				t.Fatalf("hit %d granted beyond Remaining", v.Remaining+1)
			}
		}
	})
}

func FuzzSetCompact(f *testing.F) {
	f.Add([]byte{0, 1, 5, 1, 2, 1, 1, 9, 2, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		v := make([]int64, len(data))
		for i, b := range data {
			v[i] = int64(b) - 8
		}
		var s State
		if s.SetCompact(penalties, v) == nil {
			// What reads back is usable and writes itself back unchanged.
			Request(penalties, &s, nil, t0, 3, 1)
			Inspect(penalties, &s, nil, t0)
		}
		var g Global
		_ = g.SetCompact(v)
		Inspect(penalties, &s, &g, t0)
	})
}

// TestSummaryNoTierActive: with no tier active, the summary says the next
// request enters tier 1 only when it would: not while tier 1 cools down and
// everything is rejected (the batch pattern: 50 in a minute, then nothing
// for the rest of the hour).
func TestSummaryNoTierActive(t *testing.T) {
	batch := &Policy{Tiers: []Tier{{Limit: 50, Window: time.Minute, Active: time.Minute, Cooldown: 59 * time.Minute}}}
	var s State
	var g Global
	fresh := Inspect(batch, &s, &g, t0)
	if got := fresh.Summary(batch); !strings.HasPrefix(got, "no tier active (the next request enters tier 1): 50 more hits now") {
		t.Errorf("fresh: summary %q", got)
	}
	if d := Request(batch, &s, &g, t0, 50, 50); !d.OK {
		t.Fatalf("batch of 50 rejected: %+v", d)
	}
	v := Inspect(batch, &s, &g, t0.Add(61*time.Second))
	got := v.Summary(batch)
	if v.Tier != 0 || strings.Contains(got, "enters tier 1") || !strings.HasPrefix(got, "no tier active: rejecting for 58m59s") {
		t.Errorf("in tier 1's cooldown: tier %d, summary %q; want no tier active, rejecting, and no tier entered", v.Tier, got)
	}
}
