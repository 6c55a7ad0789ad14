package tiers

import (
	"testing"
	"time"
)

// benchRequests runs b.N requests spaced by step, starting after a warm-up.
func benchRequests(b *testing.B, p *Policy, g *Global, step time.Duration) {
	var s State
	now := t0
	for range 1000 {
		Request(p, &s, g, now, 1, 1)
		now = now.Add(step)
	}
	b.ReportAllocs()
	b.ResetTimer()
	granted := 0
	for range b.N {
		if Request(p, &s, g, now, 1, 1).OK {
			granted++
		}
		now = now.Add(step)
	}
	if granted == 0 && b.N > 1000 {
		b.Fatal("nothing granted")
	}
}

func BenchmarkTwoTiers(b *testing.B) {
	p := &Policy{Tiers: []Tier{
		{Limit: 10, Window: time.Second, Active: Unbounded},
		{Limit: 100, Window: time.Second, Active: 5 * time.Second, Cooldown: 15 * time.Second},
	}}
	benchRequests(b, p, nil, time.Second/12)
}

func BenchmarkFourTiersHardGlobal(b *testing.B) {
	p := &Policy{HardLimit: 40, GlobalLimit: 1000, Tiers: []Tier{
		{Limit: 20, Window: time.Second, Active: Unbounded},
		{Limit: 40, Window: time.Second, Active: 5 * time.Second, Cooldown: 10 * time.Second},
		{Limit: 200, Window: 10 * time.Second, Active: 20 * time.Second, Cooldown: time.Minute, Skippable: true},
		{Limit: 1000, Window: time.Minute, Active: time.Minute, Cooldown: time.Hour},
	}}
	benchRequests(b, p, &Global{}, time.Second/25)
}

func BenchmarkTokenBucket(b *testing.B) {
	p := &Policy{Kind: KindTokenBucket, Bucket: TokenBucket{Capacity: 100, Refill: 10, Per: time.Second}}
	benchRequests(b, p, nil, 50*time.Millisecond)
}

func BenchmarkFixedWindow(b *testing.B) {
	p := &Policy{Kind: KindFixedWindow, Window: FixedWindow{Limit: 100, Unit: UnitMinute}}
	benchRequests(b, p, nil, 100*time.Millisecond)
}

func BenchmarkRejectedRetry(b *testing.B) {
	p := &Policy{HardLimit: 40, Tiers: []Tier{
		{Limit: 5, Window: time.Second, Active: Unbounded},
		{Limit: 20, Window: time.Second, Active: 5 * time.Second, Cooldown: 10 * time.Second},
	}}
	benchRequests(b, p, nil, time.Millisecond)
}

// BenchmarkPostPaidInDebt: a post-paid limit that stays in debt, each
// request refused, debited and given the wait until the debt is repaid (its
// log at the bound of 64 buckets of owed hits).
func BenchmarkPostPaidInDebt(b *testing.B) {
	p := &Policy{Tiers: []Tier{{Limit: 10, Window: time.Minute, Active: Unbounded}}, Overdraft: true}
	var s State
	now := t0
	for range 1000 {
		Request(p, &s, nil, now, 1, 1)
		now = now.Add(time.Millisecond)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if Request(p, &s, nil, now, 1, 1).OK {
			b.Fatal("granted in debt")
		}
		now = now.Add(time.Microsecond)
	}
}

// BenchmarkPace compares a decision with its reservation: a Lyft rule of
// 100 per second under 200 requests per second, each rejected request
// reserved at its RetryAfter (pace), against the same rule's plain
// decision.
func BenchmarkPace(b *testing.B) {
	p := &Policy{Tiers: []Tier{{Limit: 100, Window: time.Second, Active: Unbounded}}}
	for _, paced := range []bool{false, true} {
		name := "plain"
		if paced {
			name = "paced"
		}
		b.Run(name, func(b *testing.B) {
			var s State
			now := t0
			b.ReportAllocs()
			for range b.N {
				d := Request(p, &s, nil, now, 1, 1)
				if !d.OK && paced && d.RetryAfter < time.Second {
					Reserve(p, &s, nil, now, now.Add(d.RetryAfter), 1, 1)
				}
				now = now.Add(5 * time.Millisecond)
			}
		})
	}
}
