package tiers

import (
	"math/rand/v2"
	"testing"
	"time"
)

// odStep is one request of a post-paid scenario: hits at an instant (min
// is hits: all or nothing, as an RLS request), and what it must answer.
type odStep struct {
	at        time.Duration
	hits      int64
	ok        bool
	remaining int64
	retry     time.Duration // checked when not ok and >= 0
}

func runPostPaid(t *testing.T, p *Policy, steps []odStep) {
	t.Helper()
	var s State
	var g Global
	for i, st := range steps {
		now := t0.Add(st.at)
		peek := Peek(p, &s, &g, now, st.hits, st.hits)
		d := Request(p, &s, &g, now, st.hits, st.hits)
		if peek.OK != d.OK || peek.Granted != d.Granted {
			t.Fatalf("step %d: Peek answered OK %v granted %d, Request OK %v granted %d", i, peek.OK, peek.Granted, d.OK, d.Granted)
		}
		if d.OK != st.ok || d.Remaining != st.remaining {
			t.Errorf("step %d at %v, %d hits: got OK %v remaining %d, want OK %v remaining %d", i, st.at, st.hits, d.OK, d.Remaining, st.ok, st.remaining)
		}
		if !st.ok && st.retry >= 0 && d.RetryAfter != st.retry {
			t.Errorf("step %d at %v: got RetryAfter %v, want %v", i, st.at, d.RetryAfter, st.retry)
		}
		if st.ok && d.Granted != st.hits {
			t.Errorf("step %d: granted %d, want %d", i, d.Granted, st.hits)
		}
	}
}

// The pattern of a budget paid after the fact (a check of 0 hits at the
// request, the usage reported at the response), 5 per minute: the report
// that overdraws is refused and debited, and every request, the next check
// included, is refused until the window has repaid the debt.
func TestPostPaidBudget(t *testing.T) {
	s := time.Second
	sliding := &Policy{Tiers: []Tier{{Limit: 5, Window: time.Minute, Active: Unbounded}}, Overdraft: true}
	runPostPaid(t, sliding, []odStep{
		{at: 0, hits: 0, ok: true, remaining: 5},
		{at: 1 * s, hits: 4, ok: true, remaining: 1},
		{at: 2 * s, hits: 4, ok: false, remaining: 0, retry: 60 * s}, // 8 counted: 4 fit again at 62s
		{at: 3 * s, hits: 0, ok: false, remaining: 0, retry: 58 * s}, // out of debt at 61s
		{at: 4 * s, hits: 1, ok: false, remaining: 0, retry: 58 * s}, // debited too: 9
		{at: 61 * s, hits: 0, ok: true, remaining: 0},                // 5 left: 4 at 2s, 1 at 4s
		{at: 62 * s, hits: 0, ok: true, remaining: 4},
		{at: 62 * s, hits: 4, ok: true, remaining: 0},
	})

	// envoyproxy/ratelimit's fixed window with its default counting.
	fixed := &Policy{Kind: KindFixedWindow, Window: FixedWindow{Limit: 5, Unit: UnitMinute}, Overdraft: true}
	runPostPaid(t, fixed, []odStep{
		{at: 0, hits: 0, ok: true, remaining: 5},
		{at: 1 * s, hits: 4, ok: true, remaining: 1},
		{at: 2 * s, hits: 4, ok: false, remaining: 0, retry: 58 * s},
		{at: 3 * s, hits: 0, ok: false, remaining: 0, retry: 57 * s},
		{at: 60 * s, hits: 0, ok: true, remaining: 5}, // a new window
	})

	// A bucket of 5 refilled at 5 per minute goes 3 credits into debt, and
	// is refused until it is back above 0 and holds the credits asked for.
	bucket := &Policy{Kind: KindTokenBucket, Bucket: TokenBucket{Capacity: 5, Refill: 5, Per: time.Minute}, Overdraft: true}
	runPostPaid(t, bucket, []odStep{
		{at: 0, hits: 0, ok: true, remaining: 5},
		{at: 0, hits: 4, ok: true, remaining: 1},
		{at: 0, hits: 4, ok: false, remaining: 0, retry: 84 * s},      // -3: 4 credits more take 7 × 12s
		{at: 12 * s, hits: 0, ok: false, remaining: 0, retry: 24 * s}, // back to 0 at 36s
		{at: 36 * s, hits: 0, ok: true, remaining: 0},                 // balance 0: out of debt
		{at: 48 * s, hits: 1, ok: true, remaining: 0},
	})
}

// An admission policy is unchanged: a refused request consumes nothing.
func TestAdmissionConsumesNothing(t *testing.T) {
	p := &Policy{Tiers: []Tier{{Limit: 5, Window: time.Minute, Active: Unbounded}}}
	s := time.Second
	runPostPaid(t, p, []odStep{
		{at: 0, hits: 4, ok: true, remaining: 1},
		{at: 1 * s, hits: 4, ok: false, remaining: 1, retry: 59 * s},
		{at: 2 * s, hits: 0, ok: true, remaining: 1},
		{at: 3 * s, hits: 1, ok: true, remaining: 0},
	})
}

// Tiers, the hard limit and a burst honour the debt: hits that do not fit
// fill what they can and the rest is owed by the tier they end in.
func TestPostPaidTiers(t *testing.T) {
	p := &Policy{Tiers: []Tier{
		{Limit: 2, Window: time.Second, Active: Unbounded},
		{Limit: 3, Window: time.Second, Active: 10 * time.Second, Cooldown: time.Minute},
	}, HardLimit: 10, Overdraft: true}
	var st State
	now := t0
	d := Request(p, &st, nil, now, 7, 7) // 2 in tier 1, 3 in tier 2, 2 owed by tier 2
	if d.OK || d.Remaining != 0 {
		t.Fatalf("7 hits: got OK %v remaining %d, want a refusal with 0", d.OK, d.Remaining)
	}
	v := Inspect(p, &st, nil, now)
	if v.Tier != 2 || v.Tiers[1].Hits != 5 || v.Tiers[0].Hits != 2 || v.DomainHits != 7 {
		t.Fatalf("after the debit: tier %d, tier hits %d/%d, domain %d; want tier 2 with 2/5, domain 7", v.Tier, v.Tiers[0].Hits, v.Tiers[1].Hits, v.DomainHits)
	}
	if d := Request(p, &st, nil, now.Add(999*time.Millisecond), 0, 0); d.OK {
		t.Fatalf("a check in debt was granted")
	}
	if d := Request(p, &st, nil, now.Add(time.Second), 1, 1); !d.OK || d.Tier != 2 {
		t.Fatalf("after the window: got OK %v tier %d, want a grant in tier 2", d.OK, d.Tier)
	}

	// The hard limit: the domain's second is in debt.
	h := &Policy{Tiers: []Tier{{Limit: 100, Window: time.Minute, Active: Unbounded}}, HardLimit: 3, Overdraft: true}
	var hs State
	if d := Request(h, &hs, nil, now, 5, 5); d.OK || !d.LimitedByHard {
		t.Fatalf("5 hits over a hard limit of 3: got OK %v hard %v", d.OK, d.LimitedByHard)
	}
	d = Request(h, &hs, nil, now.Add(500*time.Millisecond), 0, 0)
	if d.OK || !d.LimitedByHard || d.RetryAfter != 500*time.Millisecond {
		t.Fatalf("a check in the second's debt: got OK %v hard %v retry %v, want refused by the hard limit for 500ms", d.OK, d.LimitedByHard, d.RetryAfter)
	}
}

// A state in debt stays small whatever the traffic it refuses.
func TestPostPaidDebtBounded(t *testing.T) {
	p := &Policy{Tiers: []Tier{{Limit: 3, Window: time.Hour, Active: Unbounded}}, Overdraft: true}
	var s State
	for i := range 10000 {
		Request(p, &s, nil, t0.Add(time.Duration(i)*time.Millisecond), 1, 1)
	}
	if n := len(s.tiers[0].hits.buckets()); n > debtBuckets+3 {
		t.Fatalf("%d buckets after 10000 refused requests, want at most %d", n, debtBuckets+3)
	}
	if got := s.tiers[0].hits.count(Micros(10*time.Second)+t0.UnixMicro(), Micros(time.Hour)); got != 10000 {
		t.Fatalf("counted %d hits, want every one of the 10000", got)
	}
	big := &Policy{Kind: KindFixedWindow, Window: FixedWindow{Limit: 3, Unit: UnitHour}, Overdraft: true}
	var f State
	for range 10 {
		Request(big, &f, nil, t0, maxCopies, maxCopies)
	}
	if f.val != maxCount {
		t.Fatalf("fixed window count %d, want it saturated at %d", f.val, maxCount)
	}
	b := &Policy{Kind: KindTokenBucket, Bucket: TokenBucket{Capacity: 10, Refill: 1, Per: time.Hour}, Overdraft: true}
	var bs State
	Request(b, &bs, nil, t0, maxCopies, maxCopies)
	if unit, r, capU, _ := bucketUnits(&b.Bucket); balance(&bs, t0.UnixMicro(), unit, r, capU) != -capU {
		t.Fatalf("bucket balance %d, want the floor %d", balance(&bs, t0.UnixMicro(), unit, r, capU), -capU)
	}
}

// Post-paid counting never grants more than a limit admits: the hits
// granted in any window of a one-tier policy stay within its limit, and a
// refusal debits exactly the hits asked for (below the saturation).
func FuzzPostPaidNoOverGrant(f *testing.F) {
	f.Add(uint64(1), uint8(5))
	f.Add(uint64(7), uint8(1))
	f.Fuzz(func(t *testing.T, seed uint64, lim uint8) {
		L := int64(lim%exactMax) + 1 // exact logs: a window is exact
		w := time.Second
		p := &Policy{Tiers: []Tier{{Limit: L, Window: w, Active: Unbounded}}, Overdraft: true}
		r := rand.New(rand.NewPCG(seed, 1))
		var s State
		var grants []grant
		at := int64(0)
		for range 300 {
			at += r.Int64N(int64(w/time.Microsecond) / 4)
			now := t0.Add(time.Duration(at) * time.Microsecond)
			k := r.Int64N(L + 2)
			count := func() int64 {
				if len(s.tiers) == 0 {
					return 0
				}
				return s.tiers[0].hits.count(at+t0.UnixMicro(), Micros(w))
			}
			before := count()
			d := Request(p, &s, nil, now, k, k)
			if !d.OK && count()-before != k {
				t.Fatalf("a refusal of %d hits counted %d", k, count()-before)
			}
			if d.OK {
				grants = append(grants, grant{at, d.Granted})
			}
			var inWindow int64
			for _, g := range grants {
				if at-g.at < Micros(w) {
					inWindow += g.n
				}
			}
			if inWindow > L {
				t.Fatalf("%d hits granted in one window of a limit of %d", inWindow, L)
			}
		}
	})
}

// Inspect tells a post-paid state's debt, and when it is repaid.
func TestInspectOwed(t *testing.T) {
	p := &Policy{Tiers: []Tier{{Limit: 5, Window: time.Minute, Active: Unbounded}}, Overdraft: true}
	var s State
	Request(p, &s, nil, t0, 4, 4)
	Request(p, &s, nil, t0.Add(time.Second), 4, 4)
	v := Inspect(p, &s, nil, t0.Add(2*time.Second))
	if v.Owed != 3 || v.Remaining != 0 || v.RetryAfter != 58*time.Second {
		t.Fatalf("view %+v, want 3 owed, 0 remaining, a retry in 58s", v)
	}
	want := "tier 1 of 1 (5 per 1m0s), 8 hits in its window (post-paid: 3 hits owed): rejecting for 58s; hits leave a window in 58s"
	if got := v.Summary(p); got != want {
		t.Errorf("summary\n got %q\nwant %q", got, want)
	}
	if v := Inspect(p, &s, nil, t0.Add(61*time.Second)); v.Owed != 0 {
		t.Errorf("after the window: %d owed, want 0", v.Owed)
	}
}

// bruteRetry is RetryAfter by definition, for a request of k hits all or
// nothing: the first instant after t, among those at which the state's
// meaning changes, at which the request would be granted.
func bruteRetry(p *Policy, s *State, g *Global, t int64, k int64) time.Duration {
	cur := t
	for {
		next, ok := nextEvent(p, s, g, cur)
		if !ok {
			return Unbounded
		}
		cur = next
		if Peek(p, s, g, time.UnixMicro(cur), k, k).OK {
			return FromMicros(cur - t)
		}
	}
}

// FuzzPostPaidRetry: a post-paid refusal's RetryAfter (which skips to the
// end of the debt) is the first instant that grants, found by trying every
// instant at which the state changes.
func FuzzPostPaidRetry(f *testing.F) {
	f.Add([]byte{2, 3, 4, 1, 0, 1, 2, 1, 1, 9, 9, 9, 9, 9, 9, 9, 9, 9})
	f.Add([]byte{1, 7, 3, 2, 1, 0, 0, 1, 3, 1, 4, 200, 1, 9, 8, 7, 6, 5, 4, 3})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := &bytesource{b: data}
		p := genPolicy(r, true)
		p.Overdraft = true
		var s State
		var g Global
		at := t0.UnixMicro()
		for !r.empty() {
			at += int64(r.next()) * 7919
			k := int64(r.next() % 9)
			d := Request(p, &s, &g, time.UnixMicro(at), k, k)
			if d.OK {
				continue
			}
			if want := bruteRetry(p, &s, &g, at, k); d.RetryAfter != want {
				t.Fatalf("policy %+v, %d hits at %d: RetryAfter %v, want %v", *p, k, at, d.RetryAfter, want)
			}
		}
	})
}
