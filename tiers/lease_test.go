package tiers

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestCanLease(t *testing.T) {
	one := func(limit int64, w time.Duration) *Policy {
		return &Policy{Kind: KindTiers, Tiers: []Tier{{Limit: limit, Window: w, Active: Unbounded}}}
	}
	hard := one(10, time.Minute)
	hard.HardLimit = 5
	global := one(10, time.Minute)
	global.GlobalLimit = 50
	post := one(10, time.Minute)
	post.Overdraft = true
	slots := one(10, time.Minute)
	slots.Concurrency = true
	stack := &Policy{Kind: KindTiers, Tiers: []Tier{{Limit: 5, Window: time.Second, Active: Unbounded}, {Limit: 10, Window: time.Second, Active: 5 * time.Second, Cooldown: time.Minute}}}
	prison := &Policy{Kind: KindTiers, Tiers: []Tier{{Limit: 1, Window: time.Minute, Active: time.Hour}}}
	for _, tc := range []struct {
		name  string
		p     *Policy
		lease time.Duration
		want  string // "" leasable, else a part of the reason
	}{
		{"a rate_limit", one(100, time.Minute), time.Second, ""},
		{"a window of exactly twenty leases", one(100, time.Second), 50 * time.Millisecond, ""},
		{"a window under twenty leases", one(100, time.Second), 51 * time.Millisecond, "shorter than 20 leases"},
		{"a minute, with a hard limit: its second counts", hard, 200 * time.Millisecond, "window 1s"},
		{"a hard limit, short leases", hard, 50 * time.Millisecond, ""},
		{"a global limit, short leases", global, 50 * time.Millisecond, ""},
		{"a global limit, long leases", global, time.Second, "window 1s"},
		{"post-paid", post, time.Millisecond, "post-paid"},
		{"a concurrency limit", slots, time.Millisecond, "concurrency"},
		{"a stack", stack, time.Millisecond, "several tiers"},
		{"an active period", prison, time.Millisecond, "active period"},
		{"a token bucket", &Policy{Kind: KindTokenBucket, Bucket: TokenBucket{Capacity: 10, Refill: 1, Per: time.Second}}, time.Millisecond, "token_bucket"},
		{"a fixed window", &Policy{Kind: KindFixedWindow, Window: FixedWindow{Limit: 10, Unit: UnitMinute}}, time.Millisecond, "fixed window"},
		{"closed", &Policy{Kind: KindTiers}, time.Millisecond, "no tiers"},
		{"no policy", nil, time.Millisecond, "no policy"},
		{"no lease length", one(100, time.Second), 0, "some time"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CanLease(tc.p, tc.lease)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("got %v, want nil", err)
			case tc.want != "" && err == nil:
				t.Fatalf("got nil, want an error saying %q", tc.want)
			case tc.want != "" && (!errors.Is(err, ErrCannotLease) || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want ErrCannotLease saying %q", err, tc.want)
			}
		})
	}
}

func TestLeaseFor(t *testing.T) {
	one := func(w time.Duration) *Policy {
		return &Policy{Kind: KindTiers, Tiers: []Tier{{Limit: 10, Window: w, Active: Unbounded}}}
	}
	hard := one(time.Hour)
	hard.HardLimit = 5
	for _, tc := range []struct {
		name    string
		p       *Policy
		longest time.Duration
		want    time.Duration
		err     string
	}{
		{"a minute, up to 1s", one(time.Minute), time.Second, time.Second, ""},
		{"a second, up to 1s: a twentieth", one(time.Second), time.Second, 50 * time.Millisecond, ""},
		{"an hour with a hard limit: its second", hard, time.Minute, 50 * time.Millisecond, ""},
		{"the shortest lease", one(20 * time.Millisecond), time.Second, time.Millisecond, ""},
		{"under twenty shortest leases", one(19 * time.Millisecond), time.Second, 0, "shorter than 20 leases of the shortest"},
		{"a token bucket", &Policy{Kind: KindTokenBucket, Bucket: TokenBucket{Capacity: 1, Refill: 1, Per: time.Second}}, time.Second, 0, "token_bucket"},
	} {
		got, err := LeaseFor(tc.p, tc.longest)
		switch {
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("%s: got %v, %v; want %v", tc.name, got, err, tc.want)
		case tc.err != "" && (err == nil || !errors.Is(err, ErrCannotLease) || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: got %v, %v; want an error saying %q", tc.name, got, err, tc.err)
		}
	}
}
