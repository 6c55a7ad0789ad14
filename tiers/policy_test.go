package tiers

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestValidate(t *testing.T) {
	ok := Tier{Limit: 5, Window: time.Second, Active: Unbounded}
	tests := []struct {
		p    Policy
		want string
	}{
		{Policy{Tiers: []Tier{ok}}, ""},
		{Policy{}, ""},
		{Policy{Tiers: []Tier{ok, {Limit: 1, Window: 0, Active: time.Second}}}, "tiers[1].window: must be > 0 (at least 1µs)"},
		{Policy{Tiers: []Tier{{Limit: 0, Window: time.Second, Active: time.Second}}}, "tiers[0].limit: must be >= 1"},
		{Policy{Tiers: []Tier{{Limit: 1, Window: time.Second, Active: -time.Second}}}, "tiers[0].active: must be >= 0"},
		{Policy{Tiers: []Tier{{Limit: 1, Window: Unbounded, Active: Unbounded}}}, "tiers[0].window: must not be unbounded"},
		{Policy{Tiers: []Tier{{Limit: 1, Window: time.Second, Active: 100 * 365 * 24 * time.Hour}}}, "tiers[0].active: must be at most 312749h58m26.842624s or unbounded"},
		{Policy{HardLimit: -1}, "hard_limit: must be >= 0"},
		{Policy{GlobalLimit: MaxLimit + 1}, "global_limit: must be <= 1099511627776"},
		{Policy{Kind: KindTokenBucket, Bucket: TokenBucket{Capacity: 10, Refill: 1, Per: time.Second}}, ""},
		{Policy{Kind: KindTokenBucket, Bucket: TokenBucket{Capacity: 10, Refill: 0, Per: time.Second}}, "token_bucket.refill: must be >= 1"},
		{Policy{Kind: KindTokenBucket, Bucket: TokenBucket{Capacity: MaxLimit, Refill: 1, Per: 24 * time.Hour}}, "token_bucket.capacity: too large for refill 1 per 24h0m0s (capacity × per / gcd(refill, per in µs) must be <= 2^53)"},
		{Policy{Kind: KindFixedWindow, Window: FixedWindow{Limit: 1, Unit: 9}}, "unit: unknown unit 9"},
		{Policy{Kind: 7}, "kind: unknown kind 7"},
	}
	for i, tc := range tests {
		err := Validate(&tc.p)
		got := ""
		if err != nil {
			got = err.Error()
			if !errors.Is(err, ErrInvalidPolicy) {
				t.Errorf("%d: %v does not wrap ErrInvalidPolicy", i, err)
			}
		}
		if got != tc.want {
			t.Errorf("%d: Validate = %q, want %q", i, got, tc.want)
		}
	}
}

func TestNormalize(t *testing.T) {
	p := Policy{Tiers: []Tier{
		{Limit: 5, Window: 10 * time.Second, Active: 5 * time.Second},
		{Limit: 5, Window: time.Second, Active: 0},
		{Limit: 5, Window: 2 * time.Second, Active: 7 * time.Second, Cooldown: time.Second},
		{Limit: 5, Window: time.Hour, Active: Unbounded},
	}}
	orig := append([]Tier(nil), p.Tiers...)
	got, notes := Normalize(p)
	want := []Tier{
		{Limit: 5, Window: 5 * time.Second, Active: 5 * time.Second},
		{Limit: 5, Window: 2 * time.Second, Active: 6 * time.Second, Cooldown: time.Second},
		{Limit: 5, Window: time.Hour, Active: Unbounded},
	}
	if diff := cmp.Diff(want, got.Tiers); diff != "" {
		t.Errorf("tiers (-want +got):\n%s", diff)
	}
	wantNotes := []string{
		"tiers[0]: window 10s cut to active 5s",
		"tiers[1]: removed (active 0)",
		"tiers[2]: active 7s cut to 6s (whole windows of 2s)",
	}
	if diff := cmp.Diff(wantNotes, notes); diff != "" {
		t.Errorf("notes (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(orig, p.Tiers); diff != "" {
		t.Errorf("Normalize changed its argument:\n%s", diff)
	}
	if _, notes := Normalize(got); notes != nil {
		t.Errorf("normalizing twice gave notes %v", notes)
	}
}

// TestFixedWindowAlignment checks envoyproxy/ratelimit's windows: Unix
// seconds truncated to the unit's length (a month is 30 days, a year 365).
func TestFixedWindowAlignment(t *testing.T) {
	now := time.Date(2024, 5, 1, 12, 34, 56, 789000000, time.UTC)
	sec := now.Unix()
	for _, tc := range []struct {
		u   Unit
		div int64
	}{{UnitSecond, 1}, {UnitMinute, 60}, {UnitHour, 3600}, {UnitDay, 86400}, {UnitWeek, 604800}, {UnitMonth, 2592000}, {UnitYear, 31536000}} {
		p := &Policy{Kind: KindFixedWindow, Window: FixedWindow{Limit: 1, Unit: tc.u}}
		var s State
		d := Request(p, &s, nil, now, 1, 1)
		end := time.Unix((sec/tc.div)*tc.div+tc.div, 0)
		if !d.OK || d.ResetAfter != end.Sub(now) || d.TierWindow != time.Duration(tc.div)*time.Second {
			t.Errorf("unit %d: got %+v, want reset %v", tc.u, d, end.Sub(now))
		}
		if d := Request(p, &s, nil, end.Add(-time.Microsecond), 1, 1); d.OK || d.RetryAfter != time.Microsecond {
			t.Errorf("unit %d: just before the end: %+v", tc.u, d)
		}
		if d := Request(p, &s, nil, end, 1, 1); !d.OK {
			t.Errorf("unit %d: next window rejected: %+v", tc.u, d)
		}
	}
}

func FuzzSimpleKinds(f *testing.F) {
	f.Add([]byte{0, 10, 3, 5, 1, 2, 3, 200, 4, 5, 6, 7})
	f.Add([]byte{1, 3, 2, 1, 9, 9, 9, 9, 100, 1, 1, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := &bytesource{b: data}
		var p *Policy
		if r.next()%2 == 0 {
			p = &Policy{Kind: KindTokenBucket, Bucket: TokenBucket{
				Capacity: int64(1 + r.next()%20), Refill: int64(1 + r.next()%7), Per: time.Duration(1+r.next()%50) * 37 * time.Millisecond}}
		} else {
			p = &Policy{Kind: KindFixedWindow, Window: FixedWindow{Limit: int64(1 + r.next()%10), Unit: UnitSecond + Unit(r.next()%2)}}
		}
		var s State
		now := t0.UnixMicro()
		for step := 0; step < 100 && !r.empty(); step++ {
			now += int64(r.next()) * 7919
			k := int64(1 + r.next()%8)
			m := int64(1 + r.next()%int(k))
			at := time.UnixMicro(now)
			if r.next()%5 == 0 {
				Refund(p, &s, nil, at, int64(r.next()%4))
				continue
			}
			before := s
			peek := Peek(p, &s, nil, at, k, m)
			if !cmp.Equal(s, before, stateOpts) {
				t.Fatalf("step %d: Peek changed the state", step)
			}
			d := Request(p, &s, nil, at, k, m)
			if d != peek {
				t.Fatalf("step %d: Peek %+v, Request %+v", step, peek, d)
			}
			if !d.OK {
				if !cmp.Equal(s, before, stateOpts) {
					t.Fatalf("step %d: a rejection changed the state", step)
				}
				if d.RetryAfter != Unbounded {
					ra := d.RetryAfter.Microseconds()
					if !Peek(p, &s, nil, time.UnixMicro(now+ra), k, m).OK {
						t.Fatalf("step %d: not granted at retry_after %v", step, d.RetryAfter)
					}
					if Peek(p, &s, nil, time.UnixMicro(now+ra-1), k, m).OK {
						t.Fatalf("step %d: granted before retry_after %v", step, d.RetryAfter)
					}
				}
			}
			c := s
			var singles int64
			for singles <= d.Remaining && Request(p, &c, nil, at, 1, 1).OK {
				singles++
			}
			if singles != d.Remaining {
				t.Fatalf("step %d: remaining %d, %d single hits granted", step, d.Remaining, singles)
			}
		}
	})
}

func TestNames(t *testing.T) {
	for k, want := range map[Kind]string{KindTiers: "tiers", KindTokenBucket: "token_bucket", KindFixedWindow: "fixed_window"} {
		if got := k.String(); got != want {
			t.Errorf("Kind(%d).String() = %q, want %q", uint8(k), got, want)
		}
	}
	for _, tc := range []struct {
		d    Decision
		want string
	}{
		{Decision{}, "tier"},
		{Decision{LimitedByHard: true}, "hard"},
		{Decision{LimitedByGlobal: true}, "global"},
	} {
		if got := tc.d.Limiter(); got != tc.want {
			t.Errorf("%+v.Limiter() = %q, want %q", tc.d, got, tc.want)
		}
	}
}
