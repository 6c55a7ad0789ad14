package tiers

import (
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestUnits(t *testing.T) {
	tests := []struct {
		u      Unit
		name   string
		length time.Duration
	}{
		{UnitSecond, "second", time.Second},
		{UnitMinute, "minute", time.Minute},
		{UnitHour, "hour", time.Hour},
		{UnitDay, "day", 24 * time.Hour},
		{UnitWeek, "week", 7 * 24 * time.Hour},
		{UnitMonth, "month", 30 * 24 * time.Hour},
		{UnitYear, "year", 365 * 24 * time.Hour},
		{0, "Unit(0)", 0},
		{UnitYear + 1, "Unit(8)", 0},
	}
	for _, tc := range tests {
		if got := tc.u.String(); got != tc.name {
			t.Errorf("Unit(%d).String() = %q, want %q", tc.u, got, tc.name)
		}
		if got := tc.u.Length(); got != tc.length {
			t.Errorf("%v.Length() = %v, want %v", tc.u, got, tc.length)
		}
		u, ok := ParseUnit(tc.name)
		if wantOK := tc.length != 0; ok != wantOK || (ok && u != tc.u) {
			t.Errorf("ParseUnit(%q) = %v, %v, want %v, %v", tc.name, u, ok, tc.u, wantOK)
		}
	}
	if u, ok := ParseUnit("MiNuTe"); !ok || u != UnitMinute {
		t.Errorf(`ParseUnit("MiNuTe") = %v, %v, want minute, true`, u, ok)
	}
	for _, s := range []string{"", "fortnight", "seconds"} {
		if u, ok := ParseUnit(s); ok {
			t.Errorf("ParseUnit(%q) = %v, true, want false", s, u)
		}
	}
}

func TestAppendCompact(t *testing.T) {
	const inf = math.MaxInt64
	tests := []struct {
		name string
		p    Policy
		want []int64
	}{
		{"one tier", Policy{Tiers: []Tier{{Limit: 1000, Window: time.Second, Active: Unbounded}}},
			[]int64{0, 0, 0, 125_000, 125_000, 1, 1000, 1_000_000, inf, 0, 0, 15625}},
		{"tiers, hard and global", Policy{HardLimit: 10, GlobalLimit: 500, Tiers: []Tier{
			{Limit: 5, Window: time.Second, Active: Unbounded},
			{Limit: 20, Window: time.Second, Active: 5 * time.Second, Cooldown: 15 * time.Second, Skippable: true},
			{Limit: 65, Window: time.Hour + time.Nanosecond, Active: Unbounded, Cooldown: Unbounded},
		}}, []int64{0, 10, 500, 1, 15625, 3,
			5, 1_000_000, inf, 0, 0, 1,
			20, 1_000_000, 5_000_000, 15_000_000, 1, 1,
			65, 3_600_000_000, inf, inf, 0, 56_250_000}},
		{"closed", Policy{}, []int64{0, 0, 0, 125_000, 125_000, 0}},
		{"token bucket", Policy{Kind: KindTokenBucket, Bucket: TokenBucket{Capacity: 10, Refill: 4, Per: 3 * time.Second}},
			[]int64{1, 750_000, 1, 7_500_000, 10}},
		{"token bucket, no refill", Policy{Kind: KindTokenBucket, Bucket: TokenBucket{Capacity: 10, Per: time.Second}}, []int64{3}},
		{"fixed window", Policy{Kind: KindFixedWindow, Window: FixedWindow{Limit: 7, Unit: UnitWeek}}, []int64{2, 7, 604_800_000_000}},
		{"fixed window, unknown unit", Policy{Kind: KindFixedWindow, Window: FixedWindow{Limit: 7, Unit: 9}}, []int64{3}},
		{"unknown kind", Policy{Kind: 7}, []int64{3}},
	}
	for _, tc := range tests {
		got := tc.p.AppendCompact([]int64{-1})
		if diff := cmp.Diff(append([]int64{-1}, tc.want...), got); diff != "" {
			t.Errorf("%s: AppendCompact (-want +got):\n%s", tc.name, diff)
		}
	}
}

func TestFillLimits(t *testing.T) {
	twoTiers := &Policy{HardLimit: 3, GlobalLimit: 9, Tiers: []Tier{
		{Limit: 5, Window: time.Second, Active: Unbounded},
		{Limit: 20, Window: 2 * time.Second, Active: 4 * time.Second},
	}}
	bucket := &Policy{Kind: KindTokenBucket, Bucket: TokenBucket{Capacity: 10, Refill: 4, Per: 3 * time.Second}}
	fixed := &Policy{Kind: KindFixedWindow, Window: FixedWindow{Limit: 7, Unit: UnitMinute}}
	tests := []struct {
		p    *Policy
		tier int
		want Decision
	}{
		{twoTiers, 0, Decision{HardLimit: 3, GlobalLimit: 9}},
		{twoTiers, 2, Decision{Tier: 2, HardLimit: 3, GlobalLimit: 9, TierLimit: 20, TierWindow: 2 * time.Second}},
		{twoTiers, 3, Decision{Tier: 3, HardLimit: 3, GlobalLimit: 9}},
		{bucket, 1, Decision{Tier: 1, TierLimit: 10, TierWindow: 7500 * time.Millisecond}},
		{bucket, 0, Decision{}},
		{fixed, 1, Decision{Tier: 1, TierLimit: 7, TierWindow: time.Minute}},
		{&Policy{Kind: 7}, 1, Decision{Tier: 1}},
	}
	for i, tc := range tests {
		d := Decision{Tier: tc.tier, HardLimit: 99, TierLimit: 99, TierWindow: 99}
		tc.p.FillLimits(&d)
		if diff := cmp.Diff(tc.want, d); diff != "" {
			t.Errorf("%d: FillLimits (-want +got):\n%s", i, diff)
		}
	}
}
