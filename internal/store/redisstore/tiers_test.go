package redisstore

import (
	"context"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/charonlimit/charon/internal/redisfunc"
	"github.com/charonlimit/charon/tiers"
)

// The tiers part of the decide library (tiers.lua) is held equal to
// package tiers on its own, below the store: testdata/tiers_harness.lua,
// appended to tiers.lua and state.lua (the policies' decoding), registers
// a function that applies one Request, Peek or Refund to states passed in
// their compact form and answers the decision, ForgetAt and the new
// states, which TestTiersPart compares with the Go code's. The apply part
// (apply.lua, store.Apply over a call's items) has its own differential
// test, TestApplyPart (apply_test.go), and each fast path its own
// (paths_test.go).

// Operations of the tiers harness.
const (
	opRequest = 1
	opPeek    = 2
	opRefund  = 3
	// Pacing: tiers.Reserve, PeekReserve and RefundReserved.
	opReserve  = 4
	opPeekRes  = 5
	opGiveBack = 6
)

// loadTiersHarness loads the tiers harness library into c and returns its
// function's name.
func loadTiersHarness(t *testing.T, c redis.UniversalClient) string {
	t.Helper()
	h, err := os.ReadFile("testdata/tiers_harness.lua")
	if err != nil {
		t.Fatal(err)
	}
	lib := redisfunc.New("#!lua name=charon_tiers_" + redisfunc.Placeholder + "\n" + tiersLua + paceLua + stateLua + string(h))
	if err := lib.Load(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	return lib.Function("charon_tiers_")
}

// f64Ints appends vs to b as big-endian doubles (a compact form).
func f64Ints(b []byte, vs []int64) []byte {
	for _, v := range vs {
		b = appendF64(b, v)
	}
	return b
}

// forgetMicros is a ForgetAt as the harness answers it: -1 for the zero
// time, math.MaxInt64 (+Inf) for Forever, else µs.
func forgetMicros(at time.Time) int64 {
	switch {
	case at.IsZero():
		return -1
	case at.Equal(tiers.Forever):
		return 1<<63 - 1
	}
	return at.UnixMicro()
}

// TestTiersPart replays random traces of Request, Peek and Refund
// (policies of every kind from randPolicy and randQuota, admission or
// post-paid, global limits shared by two domains, minimums, checks of 0
// hits, µs times, jumps of up to the longest period, a clock going back a
// little) against package tiers and against the tiers part through its
// harness, both starting each step from the Go side's states, and demands
// the same decision, the same ForgetAt of the state (of a quota's state
// when the step changed it) and of the global, and the same new states.
func TestTiersPart(t *testing.T) {
	_, c := singleClient(t)
	fn := loadTiersHarness(t, c)
	ctx := context.Background()
	traces, steps := 1500, 40
	if testing.Short() {
		traces = 200
	}
	ops := 0
	backs := map[tiers.Kind]int{} // give-backs that changed a state
	for seed := range uint64(traces) {
		r := rand.New(rand.NewPCG(seed, 31))
		now := time.Date(2031+r.IntN(20), time.Month(1+r.IntN(12)), 1+r.IntN(28), r.IntN(24), 0, 0, 0, time.UTC)
		var p *tiers.Policy
		if r.IntN(8) == 0 {
			p = randQuota(t, r, now)
		} else {
			p = randPolicy(r)
		}
		span := 20 * time.Second
		for _, d := range []time.Duration{p.Bucket.Per, p.Window.Unit.Length()} {
			span = max(span, d)
		}
		for _, tr := range p.Tiers {
			for _, d := range []time.Duration{tr.Window, tr.Active, tr.Cooldown} {
				if d != tiers.Unbounded {
					span = max(span, d)
				}
			}
		}
		if p.Kind == tiers.KindQuota {
			span = 40 * 24 * time.Hour
		}
		// Two domains' states; the global, when the policy has one, is
		// shared by both.
		states := make([]tiers.State, 2)
		// Per state, the reservations granted (their instants and hits),
		// for the give-backs.
		type reserved struct {
			at   time.Time
			hits int64
		}
		pending := make([][]reserved, 2)
		// Per state, the instants of a concurrency limit's grants, for the
		// refunds that name their takes.
		taken := make([][]time.Time, 2)
		var g *tiers.Global
		if p.GlobalLimit > 0 {
			g = new(tiers.Global)
		}
		for step := range steps {
			if r.IntN(10) == 0 {
				// A reload, or a request's own limit: the rule's state read
				// under new numbers of the same shape (SPEC §3).
				p = renumber(t, r, p)
			}
			switch r.IntN(10) {
			case 0: // same instant
			case 1:
				now = now.Add(randDur(r, time.Second, 20*time.Second))
			case 2:
				now = now.Add(-randDur(r, time.Microsecond, 5*time.Millisecond))
			case 3:
				now = now.Add(randDur(r, time.Second, span))
			default:
				now = now.Add(randDur(r, time.Microsecond, 400*time.Millisecond))
			}
			si := r.IntN(2)
			s := &states[si]
			op := opRequest
			switch r.IntN(10) {
			case 0:
				op = opPeek
			case 1:
				op = opRefund
			case 2, 3:
				op = opReserve
			case 4:
				op = opPeekRes
			case 5:
				if len(pending[si]) > 0 {
					op = opGiveBack
				}
			}
			// A reservation's instant: up to a second or an eighth of the
			// span ahead (a window's next one), at times now itself.
			at := now.Add(randDur(r, time.Microsecond, max(time.Second, span/8)))
			if r.IntN(12) == 0 {
				at = now
			}
			k := int64(1 + r.IntN(4))
			switch r.IntN(8) {
			case 0:
				k = 1 + r.Int64N(150)
			case 1:
				k = 0
			}
			m := r.Int64N(k + 1)
			if r.IntN(10) == 0 {
				m = k + 1
			}

			if op == opGiveBack {
				i := r.IntN(len(pending[si]))
				at, k = pending[si][i].at, pending[si][i].hits
				pending[si] = slices.Delete(pending[si], i, i+1)
			}
			h := f64s(nil, int64(op), now.UnixMicro(), k, m)
			if op >= opReserve {
				h = f64s(h, at.UnixMicro())
			}
			// A concurrency limit's refund names a take (a grant's
			// instant, or any instant) two times in three.
			var slots time.Time
			if op == opRefund && p.Concurrency && r.IntN(3) > 0 {
				slots = now.Add(-randDur(r, 0, span))
				if n := len(taken[si]); n > 0 && r.IntN(4) > 0 {
					slots = taken[si][r.IntN(n)]
				}
				h = f64s(h, max(1, slots.UnixMicro()))
			}
			gv := ""
			if g != nil {
				gv = string(f64Ints(nil, g.AppendCompact(nil)))
			}
			before := s.AppendCompact(p, nil)
			rep, err := c.Do(ctx, "fcall", fn, 0, string(h), encodePolicy(p, now).arg, string(f64Ints(nil, before)), gv).Text()
			if err != nil {
				t.Fatalf("seed %d step %d: %v", seed, step, err)
			}
			ops++

			var want tiers.Decision
			switch op {
			case opRequest:
				want = tiers.Request(p, s, g, now, k, m)
				if !want.SlotsAt.IsZero() {
					taken[si] = append(taken[si], want.SlotsAt)
				}
			case opPeek:
				want = tiers.Peek(p, s, g, now, k, m)
			case opRefund:
				tiers.RefundSlots(p, s, g, now, slots, k)
			case opReserve:
				want = tiers.Reserve(p, s, g, now, at, k, m)
				if want.OK && want.Granted > 0 {
					pending[si] = append(pending[si], reserved{at, want.Granted})
				}
			case opPeekRes:
				want = tiers.PeekReserve(p, s, g, now, at, k, m)
			case opGiveBack:
				tiers.RefundReserved(p, s, g, now, at, k)
			}
			rd := &reader{b: rep}
			got := decision(p, rd)
			// The harness answers no instant: the store's reply does
			// (stampSlots), which TestApplyPart checks.
			stampSlots(p, &got, now.UnixMicro())
			if op >= opReserve {
				stampSlots(p, &got, at.UnixMicro())
			}
			if op == opRefund || op == opGiveBack {
				got = tiers.Decision{}
			}
			type after struct {
				Decision       tiers.Decision
				Forget, Global int64
				State, GState  []int64
			}
			w := after{Decision: want, Forget: forgetMicros(tiers.ForgetAt(p, s)), Global: -1, State: s.AppendCompact(p, nil)}
			gt := after{Decision: got, Forget: rd.num(), Global: rd.num()}
			n := rd.num()
			for range n {
				gt.State = append(gt.State, rd.num())
			}
			if g != nil {
				w.Global, w.GState = forgetMicros(g.ForgetAt()), g.AppendCompact(nil)
				for rd.err == nil && len(rd.b) > 0 {
					gt.GState = append(gt.GState, rd.num())
				}
			}
			if op == opGiveBack && !slices.Equal(before, w.State) {
				backs[p.Kind]++
			}
			if p.Kind == tiers.KindQuota && slices.Equal(before, w.State) {
				// The library knows a quota's periods around now only (its
				// boundary table): it computes ForgetAt of the states it
				// writes, of the period holding now.
				gt.Forget = w.Forget
			}
			if rd.err != nil || len(rd.b) > 0 {
				t.Fatalf("seed %d step %d: malformed reply %x", seed, step, rep)
			}
			if diff := cmp.Diff(w, gt); diff != "" {
				t.Fatalf("seed %d step %d: policy %+v, op %d at %v, copies %d, min %d, state %v:\n(-tiers +tiers.lua)\n%s",
					seed, step, *p, op, now, k, m, before, diff)
			}
		}
	}
	t.Logf("%d operations; give-backs that changed a state, by kind: %v", ops, backs)
	if !testing.Short() && backs[tiers.KindTokenBucket] < 20 {
		t.Fatalf("%d bucket give-backs gave something back: too few to test them", backs[tiers.KindTokenBucket])
	}
}

// renumber returns a policy of p's shape (tiers.Policy.Shape) with other
// numbers: the tiers' limits, the hard and global limits (set when p's
// are), a bucket's capacity, refill and period, a window's or a quota's
// limit, post-paid counting.
func renumber(t *testing.T, r *rand.Rand, p *tiers.Policy) *tiers.Policy {
	for range 1000 {
		c := *p
		c.Tiers = slices.Clone(p.Tiers)
		for i := range c.Tiers {
			switch r.IntN(3) {
			case 0:
				c.Tiers[i].Limit = 1 + r.Int64N(8)
			case 1:
				c.Tiers[i].Limit = 1 + r.Int64N(70)
			default:
				c.Tiers[i].Limit = 60 + r.Int64N(300)
			}
		}
		if c.HardLimit > 0 {
			c.HardLimit = 1 + r.Int64N(100)
		}
		if c.GlobalLimit > 0 {
			c.GlobalLimit = 1 + r.Int64N(150)
		}
		if c.Kind == tiers.KindTokenBucket {
			c.Bucket.Capacity = 1 + r.Int64N(200)
			c.Bucket.Refill = 1 + r.Int64N(50)
			if r.IntN(2) == 0 {
				c.Bucket.Per = randDur(r, time.Microsecond, 2*p.Bucket.Per)
			}
		}
		c.Window.Limit = 1 + r.Int64N(100)
		c.Quota.Limit = 1 + r.Int64N(6)
		c.Overdraft = r.IntN(3) == 0
		if tiers.Validate(&c) == nil && c.Shape() == p.Shape() {
			return &c
		}
	}
	t.Fatalf("no policy of the shape of %+v", *p)
	return nil
}
