package tiers

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// slotClient is one request of a concurrency trace: its slots, the instant
// they were stamped with, and how it ended.
type slotClient struct {
	k        int64
	at       int64 // µs
	slotsAt  time.Time
	inFlight bool // granted, neither refunded nor killed
	killed   bool // ended without a refund
}

// concurrencyTrace runs a random trace of takes, refunds and kills on a
// concurrency limit of limit slots living ttl, at instants that only go
// forward, checking at every step and at instants in between:
//   - the requests in flight hold at most limit slots, and the log holds at
//     least theirs at every age (newest first), which is what keeps the
//     first true at every later instant;
//   - with named refunds (RefundSlots), the log holds exactly the slots of
//     the requests in flight and of the killed ones whose bucket is still in
//     the window: a leaked slot lives its time to live, no more;
//   - with unnamed refunds (Refund), once every request has ended and no
//     slot was taken for ttl, nothing is held.
//
// Every refund comes before its take's bucket leaves the window (the
// guarantee's premise; a request longer than ttl is TestConcurrencyLateRefund's).
func concurrencyTrace(t *testing.T, seed uint64, limit int64, ttl time.Duration, named bool) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 7))
	p := &Policy{Kind: KindTiers, Concurrency: true, Tiers: []Tier{{Limit: limit, Window: ttl, Active: Unbounded}}}
	if err := Validate(p); err != nil {
		t.Fatal(err)
	}
	w := Micros(ttl)
	b := tierWidth(limit, w, false)
	s := &State{}
	start := time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	now := start
	var clients []*slotClient
	lastTake := now
	where := func(step int) string {
		return fmt.Sprintf("seed %d limit %d ttl %v named %v step %d at +%dµs", seed, limit, ttl, named, step, now-start)
	}
	// deadline is the last instant a refund of c may come: its bucket is
	// counted while its start is after now-w.
	deadline := func(c *slotClient) int64 { return floorDiv(c.at, b)*b + w - 1 }

	check := func(step int) {
		t.Helper()
		var inflight, leaked int64
		var own []int64 // bucket starts of the in-flight requests' slots, one per slot
		for _, c := range clients {
			bucket := floorDiv(c.at, b) * b
			switch {
			case c.inFlight:
				inflight += c.k
				for range c.k {
					own = append(own, bucket)
				}
			case c.killed && bucket > now-w:
				leaked += c.k
			}
		}
		held := Peek(p, s, nil, time.UnixMicro(now), 0, 0).TierHits
		if inflight > limit {
			t.Fatalf("%s: %d slots in flight, over the limit %d", where(step), inflight, limit)
		}
		if held > limit {
			t.Fatalf("%s: %d slots held, over the limit %d", where(step), held, limit)
		}
		// The log's slots, newest first, outnumber the in-flight ones at
		// every age.
		var log []entry
		if len(s.tiers) > 0 {
			log = s.tiers[0].hits.buckets()
		}
		for _, x := range own {
			var nl, nf int64
			for _, e := range log {
				if e.at >= x && e.at > now-w {
					nl += e.n
				}
			}
			for _, y := range own {
				if y >= x {
					nf++
				}
			}
			if nl < nf {
				t.Fatalf("%s: the log holds %d slots stamped at or after %d, the requests in flight %d (log %v)", where(step), nl, x, nf, log)
			}
		}
		if named && held != inflight+leaked {
			t.Fatalf("%s: %d slots held, want %d in flight plus %d leaked within their time to live", where(step), held, inflight, leaked)
		}
	}

	steps := 400
	for step := range steps {
		switch op := r.IntN(10); {
		case op < 4: // a take of 1 to 3 slots (at most the limit)
			k := min(int64(1+r.IntN(3)), limit)
			d := Request(p, s, nil, time.UnixMicro(now), k, k)
			var inflight int64
			for _, c := range clients {
				if c.inFlight {
					inflight += c.k
				}
			}
			if named && !d.OK && inflight+k <= limit {
				// Named refunds leave no slot held by no one but the
				// leaked ones; count them before blaming the log.
				var leaked int64
				for _, c := range clients {
					if c.killed && floorDiv(c.at, b)*b > now-w {
						leaked += c.k
					}
				}
				if inflight+leaked+k <= limit {
					t.Fatalf("%s: %d slots rejected with %d in flight and %d leaked of %d", where(step), k, inflight, leaked, limit)
				}
			}
			if d.OK {
				if d.Granted != k || !d.SlotsAt.Equal(time.UnixMicro(now)) {
					t.Fatalf("%s: granted %d slots stamped %v, want %d stamped %v", where(step), d.Granted, d.SlotsAt, k, time.UnixMicro(now))
				}
				clients = append(clients, &slotClient{k: k, at: now, slotsAt: d.SlotsAt, inFlight: true})
				lastTake = now
			}
		case op < 7: // a refund of a request in flight
			if c := pick(r, clients); c != nil {
				if named {
					RefundSlots(p, s, nil, time.UnixMicro(now), c.slotsAt, c.k)
				} else {
					Refund(p, s, nil, time.UnixMicro(now), c.k)
				}
				c.inFlight = false
			}
		case op < 8: // a request in flight killed: no refund ever comes
			if c := pick(r, clients); c != nil {
				c.inFlight, c.killed = false, true
			}
		default: // time passes, up to half the ttl
			next := now + 1 + r.Int64N(w/2+1)
			// Requests whose slots would leave the window end first,
			// refunded or killed.
			for _, c := range clients {
				if c.inFlight && deadline(c) < next {
					now = max(now, c.at)
					if r.IntN(2) == 0 {
						if named {
							RefundSlots(p, s, nil, time.UnixMicro(now), c.slotsAt, c.k)
						} else {
							Refund(p, s, nil, time.UnixMicro(now), c.k)
						}
						c.inFlight = false
					} else {
						c.inFlight, c.killed = false, true
					}
				}
			}
			// Checked at an instant in between too.
			mid := now + (next-now)/2
			now = mid
			check(step)
			now = next
		}
		check(step)
	}
	// Every request ends; ttl after the last take nothing is held.
	for _, c := range clients {
		if c.inFlight {
			if named {
				RefundSlots(p, s, nil, time.UnixMicro(now), c.slotsAt, c.k)
			} else {
				Refund(p, s, nil, time.UnixMicro(now), c.k)
			}
			c.inFlight = false
		}
	}
	now = max(now, lastTake+w)
	check(steps)
	if held := Peek(p, s, nil, time.UnixMicro(now), 0, 0).TierHits; held != 0 {
		t.Fatalf("%s: %d slots held %v after the last take, none in flight", where(steps), held, ttl)
	}
}

// pick returns a random request in flight, or nil.
func pick(r *rand.Rand, clients []*slotClient) *slotClient {
	var in []*slotClient
	for _, c := range clients {
		if c.inFlight {
			in = append(in, c)
		}
	}
	if len(in) == 0 {
		return nil
	}
	return in[r.IntN(len(in))]
}

// TestConcurrencyTraces: random traces of takes, refunds and kills keep the
// requests in flight within the limit at every instant, with refunds that
// name their takes and with refunds that do not, with exact logs (limits
// up to 64) and bucketed ones; with named refunds a killed request's slots
// live exactly their time to live.
func TestConcurrencyTraces(t *testing.T) {
	for _, limit := range []int64{1, 2, 5, 64, 65, 200} {
		for _, ttl := range []time.Duration{time.Millisecond, 3 * time.Second, 10 * time.Minute} {
			for _, named := range []bool{true, false} {
				for seed := range uint64(8) {
					concurrencyTrace(t, seed, limit, ttl, named)
				}
			}
		}
	}
}

// FuzzConcurrency runs concurrencyTrace on the fuzzer's seeds.
func FuzzConcurrency(f *testing.F) {
	f.Add(uint64(1), uint16(3), uint32(10_000), true)
	f.Add(uint64(2), uint16(100), uint32(2_000_000), false)
	f.Fuzz(func(t *testing.T, seed uint64, limit uint16, ttlMicros uint32, named bool) {
		if limit == 0 || ttlMicros == 0 {
			return
		}
		concurrencyTrace(t, seed, int64(limit), time.Duration(ttlMicros)*time.Microsecond, named)
	})
}

// TestConcurrencyRefundOldest: a refund naming no take gives back the
// oldest slot, whatever request it comes from; a burst tier gives back its
// newest hit.
func TestConcurrencyRefundOldest(t *testing.T) {
	at := func(sec int) time.Time { return time.Unix(1_700_000_000+int64(sec), 0) }
	for _, conc := range []bool{true, false} {
		p := &Policy{Kind: KindTiers, Concurrency: conc, Tiers: []Tier{{Limit: 3, Window: 10 * time.Second, Active: Unbounded}}}
		s := &State{}
		for _, sec := range []int{0, 4, 5} {
			if d := Request(p, s, nil, at(sec), 1, 1); !d.OK {
				t.Fatalf("concurrency %v: take at %d rejected", conc, sec)
			}
		}
		Refund(p, s, nil, at(6), 1)
		var got []int64
		for _, e := range s.tiers[0].hits.buckets() {
			got = append(got, (e.at-at(0).UnixMicro())/1e6)
		}
		want := []int64{4, 5}
		if !conc {
			want = []int64{0, 4}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("concurrency %v: slots stamped %v (s) after the refund, want %v", conc, got, want)
		}
	}
}

// TestConcurrencyLateRefund: a request that outlives the ttl lost its slot
// when the ttl passed; its refund then, when it names its take, gives back
// nothing (the slots held are other requests'), and when it does not, the
// oldest slot held, another request's: the reason the ttl must exceed the
// longest request.
func TestConcurrencyLateRefund(t *testing.T) {
	at := func(sec int) time.Time { return time.Unix(1_700_000_000+int64(sec), 0) }
	p := &Policy{Kind: KindTiers, Concurrency: true, Tiers: []Tier{{Limit: 2, Window: 10 * time.Second, Active: Unbounded}}}
	for _, named := range []bool{true, false} {
		s := &State{}
		long := Request(p, s, nil, at(0), 1, 1)
		Request(p, s, nil, at(5), 1, 1)
		if d := Request(p, s, nil, at(11), 1, 1); !d.OK { // the first slot left at 10
			t.Fatal("no slot at 11")
		}
		if named {
			RefundSlots(p, s, nil, at(12), long.SlotsAt, 1)
		} else {
			Refund(p, s, nil, at(12), 1)
		}
		want := int64(2)
		if !named {
			want = 1
		}
		if got := Peek(p, s, nil, at(12), 0, 0).TierHits; got != want {
			t.Errorf("named %v: %d slots held after a late refund, want %d", named, got, want)
		}
	}
}

// TestConcurrencyValidate: what a concurrency limit may not be.
func TestConcurrencyValidate(t *testing.T) {
	one := func(f func(p *Policy)) *Policy {
		p := &Policy{Kind: KindTiers, Concurrency: true, Tiers: []Tier{{Limit: 2, Window: time.Minute, Active: Unbounded}}}
		f(p)
		return p
	}
	for _, tc := range []struct {
		name  string
		p     *Policy
		field string
	}{
		{"ok", one(func(*Policy) {}), ""},
		{"limit 0", one(func(p *Policy) { p.Tiers[0].Limit = 0 }), "tiers[0].limit"},
		{"ttl 0", one(func(p *Policy) { p.Tiers[0].Window = 0 }), "tiers[0].window"},
		{"two tiers", one(func(p *Policy) { p.Tiers = append(p.Tiers, p.Tiers[0]) }), "concurrency"},
		{"active", one(func(p *Policy) { p.Tiers[0].Active = time.Hour }), "concurrency"},
		{"cooldown", one(func(p *Policy) { p.Tiers[0].Cooldown = time.Hour }), "concurrency"},
		{"hard", one(func(p *Policy) { p.HardLimit = 5 }), "hard_limit"},
		{"global", one(func(p *Policy) { p.GlobalLimit = 5 }), "global_limit"},
		{"overdraft", one(func(p *Policy) { p.Overdraft = true }), "overdraft"},
		{"bucket", &Policy{Kind: KindTokenBucket, Concurrency: true, Bucket: TokenBucket{Capacity: 1, Refill: 1, Per: time.Second}}, "concurrency"},
	} {
		err := Validate(tc.p)
		var field string
		if fe, ok := err.(*FieldError); ok {
			field = fe.Field
		} else if err != nil {
			field = err.Error()
		}
		if field != tc.field {
			t.Errorf("%s: Validate = %v, want an error naming %q", tc.name, err, tc.field)
		}
	}
	if err := CanPace(one(func(*Policy) {})); err == nil {
		t.Error("CanPace accepts a concurrency limit")
	}
}

// TestConcurrencyShape: a concurrency limit and a sliding window of the
// same length are different rules; other shapes are unchanged by the flag's
// existence (their keys, and so their counts, survive an upgrade).
func TestConcurrencyShape(t *testing.T) {
	tier := []Tier{{Limit: 5, Window: time.Minute, Active: Unbounded}}
	sliding := &Policy{Kind: KindTiers, Tiers: tier}
	conc := &Policy{Kind: KindTiers, Tiers: tier, Concurrency: true}
	if sliding.Shape() == conc.Shape() {
		t.Error("a concurrency limit has the shape of a sliding window")
	}
	if got, want := string(sliding.AppendShape(nil)), "\x00\x01\x00\x80\x9c\x9c9"; got != want {
		t.Errorf("a sliding window's shape bytes %q, want %q (as before concurrency limits)", got, want)
	}
	if got := conc.AppendCompact(nil); got[len(got)-1] != 2 {
		t.Errorf("compact form %v does not end with 2", got)
	}
	if got := sliding.AppendCompact(nil); len(got) != 12 {
		t.Errorf("a sliding window's compact form %v has %d integers, want 12", got, len(got))
	}
}
