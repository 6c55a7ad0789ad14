package tiers

import (
	"errors"
	"slices"
	"testing"
	"time"
)

// answer is a grant as a client sees it: n hits answered at the instant at
// (a reservation's instant for a paced request), by domain dom.
type answer struct {
	at, n int64
	dom   int
	seq   int // the request's arrival order
	paced bool
	gone  bool // cancelled while waiting: given back, never answered
}

// pacer replays a random trace of plain and paced requests over two domains
// sharing a Global, as the engine would: a rejected request whose wait is
// within pace is reserved at the instant of its grant (trying again at the
// wait a refused reservation answers, a few times), and some waits are
// cancelled before their instant, giving the reservation back.
func pacer(t *testing.T, r *bytesource, p *Policy, exact bool, sameSize bool) []answer {
	t.Helper()
	states := [2]*State{{exact: exact}, {exact: exact}}
	g := &Global{exact: exact}
	pace := int64(1+r.next()%30) * 100_000
	now := int64(1_000_000_000)
	var out []answer
	k0 := int64(1 + r.next()%3)
	for seq := 0; !r.empty() && seq < 400; seq++ {
		now += int64(r.next()%8) * 25_000
		op := r.next()
		dom := op % 2
		k := k0
		if !sameSize {
			k = int64(1 + (op/2)%3)
		}
		s := states[dom]
		if op%7 == 6 && !sameSize {
			// Cancel the oldest wait of this domain still pending.
			for i := range out {
				a := &out[i]
				if a.dom == dom && a.paced && !a.gone && a.at > now {
					RefundReserved(p, s, g, time.UnixMicro(now), time.UnixMicro(a.at), a.n)
					a.gone = true
					if exact || p.Kind != KindTiers {
						probe(t, p, states, g, out, now, pace)
					}
					break
				}
			}
			continue
		}
		if seq%16 == 0 && (exact || p.Kind != KindTiers) {
			// (Bucketed logs forget a hit up to a bucket's width early,
			// tiers/doc.go's lenient bound: a probe would find it.)
			probe(t, p, states, g, out, now, pace)
		}
		d := Request(p, s, g, time.UnixMicro(now), k, k)
		if d.OK {
			out = append(out, answer{at: now, n: d.Granted, dom: dom, seq: seq})
			continue
		}
		wait := Micros(d.RetryAfter)
		for try := 0; try < 4 && wait > 0 && wait <= pace; try++ {
			at := now + wait
			peek := PeekReserve(p, s, g, time.UnixMicro(now), time.UnixMicro(at), k, k)
			rd := Reserve(p, s, g, time.UnixMicro(now), time.UnixMicro(at), k, k)
			if peek != rd {
				t.Fatalf("seq %d: PeekReserve %+v, Reserve %+v", seq, peek, rd)
			}
			if rd.OK {
				out = append(out, answer{at: at, n: rd.Granted, dom: dom, seq: seq, paced: true})
				break
			}
			if rd.RetryAfter == Unbounded {
				break
			}
			wait += Micros(rd.RetryAfter)
		}
	}
	return out
}

// probe checks what the states would grant next against the answers of
// the run so far, given-back reservations left out: at instants from now
// to now+pace, the most PeekReserve grants each domain, answered there
// beside the live answers, keeps every limit (checkAnswers). So a
// give-back never lets later grants exceed what a run in which the
// cancelled request had never come would allow.
func probe(t *testing.T, p *Policy, states [2]*State, g *Global, as []answer, now, pace int64) {
	t.Helper()
	k := p.Bucket.Capacity
	switch p.Kind {
	case KindTiers:
		k = p.Tiers[0].Limit
	case KindFixedWindow:
		k = p.Window.Limit
	}
	for dom, s := range states {
		for i := range int64(5) {
			at := now + i*pace/4
			d := PeekReserve(p, s, g, time.UnixMicro(now), time.UnixMicro(at), k, 1)
			if !d.OK || d.Granted == 0 {
				continue
			}
			near := as
			if p.Kind == KindTiers {
				// Only the windows holding at can go over.
				span := max(Micros(p.Tiers[0].Window), second)
				near = nil
				for _, a := range as {
					if a.at > at-span && a.at < at+span {
						near = append(near, a)
					}
				}
			}
			checkAnswers(t, p, append(slices.Clip(near), answer{at: at, n: d.Granted, dom: dom, seq: -1}))
		}
	}
}

// checkAnswers checks the limits of p on the instants hits were answered
// at: no window of a tier (active for ever) holds more than its limit per
// domain, no second more than the hard limit per domain nor the global
// limit over both, and a token bucket never gives more than its capacity
// plus its refill over any span.
func checkAnswers(t *testing.T, p *Policy, as []answer) {
	t.Helper()
	var live []answer
	for _, a := range as {
		if !a.gone {
			live = append(live, a)
		}
	}
	slices.SortStableFunc(live, func(a, b answer) int { return int(a.at - b.at) })
	within := func(w int64, dom int, limit int64, what string) {
		for i, a := range live {
			var n int64
			for _, b := range live[i:] {
				if b.at-a.at >= w {
					break
				}
				if dom < 0 || b.dom == dom {
					n += b.n
				}
			}
			if (dom < 0 || a.dom == dom) && n > limit {
				t.Fatalf("%s: %d hits answered in the %dµs from %d, limit %d; policy %+v; answers %+v", what, n, w, a.at, limit, p, live)
			}
		}
	}
	switch p.Kind {
	case KindTiers:
		for dom := range 2 {
			if tr := p.Tiers[0]; tr.Active == Unbounded {
				within(Micros(tr.Window), dom, tr.Limit, "tier")
			}
			if p.HardLimit > 0 {
				within(second, dom, p.HardLimit, "hard limit")
			}
		}
		if p.GlobalLimit > 0 {
			within(second, -1, p.GlobalLimit, "global limit")
		}
	case KindFixedWindow:
		// Per domain, no window of the unit answers more than the limit.
		l := unitMicros(p.Window.Unit)
		for dom := range 2 {
			n := map[int64]int64{}
			for _, a := range live {
				if a.dom != dom {
					continue
				}
				w := floorDiv(a.at, l)
				if n[w] += a.n; n[w] > p.Window.Limit {
					t.Fatalf("fixed window: %d hits answered in the window from %d, limit %d; answers %+v", n[w], w*l, p.Window.Limit, live)
				}
			}
		}
	case KindTokenBucket:
		// A bucket that starts full, refilled between answers and drawn
		// by them (in credits times per: exact), never goes below 0: no
		// span gives more than the capacity plus its refill.
		per := Micros(p.Bucket.Per)
		full := p.Bucket.Capacity * per
		for dom := range 2 {
			level, last := full, int64(-1)
			for _, a := range live {
				if a.dom != dom {
					continue
				}
				if last >= 0 {
					level = min(full, level+p.Bucket.Refill*(a.at-last))
				}
				last = a.at
				if level -= a.n * per; level < 0 {
					t.Fatalf("bucket: %d hits answered at %d, %d µs of refill short; policy %+v; answers %+v", a.n, a.at, -level/p.Bucket.Refill, p.Bucket, live)
				}
			}
		}
	}
}

// genPaced draws a policy that CanPace: one tier (active for ever, or for
// a while with a cooldown), optional hard and global limits; a bucket; or
// a fixed window of a second.
func genPaced(r *bytesource, big bool) *Policy {
	if r.next()%5 == 0 {
		w := FixedWindow{Limit: int64(1 + r.next()%8), Unit: UnitSecond}
		if big && r.next()%2 == 1 {
			w.Limit = int64(60 + r.next())
		}
		return &Policy{Kind: KindFixedWindow, Window: w}
	}
	if r.next()%4 == 0 {
		return &Policy{Kind: KindTokenBucket, Bucket: TokenBucket{
			Capacity: int64(1 + r.next()%8), Refill: int64(1 + r.next()%4), Per: time.Duration(1+r.next()%10) * 100 * time.Millisecond,
		}}
	}
	tr := Tier{Limit: int64(1 + r.next()%8), Window: time.Duration(1+r.next()%20) * 100 * time.Millisecond, Active: Unbounded}
	if big && r.next()%2 == 1 {
		tr.Limit = int64(60 + r.next())
	}
	if r.next()%4 == 0 {
		tr.Active = tr.Window * time.Duration(1+r.next()%3)
		tr.Cooldown = time.Duration(r.next()%4) * 300 * time.Millisecond
	}
	p := &Policy{Tiers: []Tier{tr}}
	if r.next()%3 == 0 {
		p.HardLimit = int64(1 + r.next()%12)
	}
	if r.next()%3 == 0 {
		p.GlobalLimit = int64(1 + r.next()%16)
	}
	return p
}

// FuzzPace: paced grants never exceed a limit on the instants they are
// answered at (exact logs, and the bucketed ones with limits above 64),
// and requests of one size are answered in the order they came, per
// domain, when no wait is cancelled.
func FuzzPace(f *testing.F) {
	f.Add([]byte{1, 2, 3, 0, 0, 0, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{0, 3, 2, 5, 1, 0, 20, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 6, 6, 13, 13, 1, 1})
	f.Add([]byte{2, 1, 4, 0, 3, 2, 1, 1, 1, 1, 1, 1, 1, 1, 6, 6, 6, 6, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, big := range []bool{false, true} {
			r := &bytesource{b: data}
			p := genPaced(r, big)
			if err := Validate(p); err != nil {
				return
			}
			same := r.next()%2 == 0
			as := pacer(t, r, p, !big, same)
			checkAnswers(t, p, as)
			if !same {
				continue
			}
			last := [2]int64{}
			for _, a := range as {
				if a.at < last[a.dom] {
					t.Fatalf("request %d answered at %d, before an earlier request's %d; policy %+v", a.seq, a.at, last[a.dom], p)
				}
				last[a.dom] = a.at
			}
		}
	})
}

// TestPaceBurst: a burst of twice the limit, every request paced with a
// generous wait, is granted in full, in order, spread over the next window,
// never more than the limit in any window.
func TestPaceBurst(t *testing.T) {
	p := &Policy{Tiers: []Tier{{Limit: 5, Window: time.Second, Active: Unbounded}}}
	s := &State{}
	now := time.Unix(1000, 0)
	var as []answer
	for i := range 10 {
		at := now.Add(time.Duration(i) * time.Millisecond)
		d := Request(p, s, nil, at, 1, 1)
		if d.OK {
			as = append(as, answer{at: at.UnixMicro(), n: 1, seq: i})
			continue
		}
		rd := Reserve(p, s, nil, at, at.Add(d.RetryAfter), 1, 1)
		if !rd.OK {
			t.Fatalf("request %d: reservation at +%v refused: %+v", i, d.RetryAfter, rd)
		}
		as = append(as, answer{at: at.Add(d.RetryAfter).UnixMicro(), n: 1, seq: i, paced: true})
	}
	checkAnswers(t, p, as)
	for i, a := range as {
		want := now.Add(time.Duration(i) * time.Millisecond)
		if i >= 5 {
			want = now.Add(time.Duration(i-5)*time.Millisecond + time.Second)
		}
		if a.at != want.UnixMicro() {
			t.Errorf("request %d answered at %v, want %v", i, time.UnixMicro(a.at).Sub(now), want.Sub(now))
		}
	}
}

// TestReserveRules: what is never reserved.
func TestReserveRules(t *testing.T) {
	now := time.Unix(1000, 0)
	later := now.Add(500 * time.Millisecond)
	stack := &Policy{Tiers: []Tier{{Limit: 1, Window: time.Second, Active: Unbounded}, {Limit: 2, Window: time.Second, Active: Unbounded}}}
	fixed := &Policy{Kind: KindFixedWindow, Window: FixedWindow{Limit: 1, Unit: UnitSecond}}
	post := &Policy{Tiers: []Tier{{Limit: 1, Window: time.Second, Active: Unbounded}}, Overdraft: true}
	phased := &Policy{Tiers: []Tier{{Limit: 1, Window: 200 * time.Millisecond, Active: 400 * time.Millisecond, Cooldown: time.Second}}}
	for _, tc := range []struct {
		name string
		p    *Policy
		at   time.Time
	}{
		{"a stack of tiers", stack, later},
		{"a fixed window's window after the next", fixed, now.Add(2 * time.Second)},
		{"post-paid", post, later},
		{"past the tier's active period", phased, later},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &State{}
			Request(tc.p, s, nil, now.Add(-100*time.Millisecond), 1, 1)
			before := cloneState(s)
			d := Reserve(tc.p, s, nil, now, tc.at, 1, 1)
			if d.OK || d.RetryAfter != Unbounded {
				t.Errorf("got %+v, want a refusal with RetryAfter Unbounded", d)
			}
			if !cmpState(before, s) {
				t.Errorf("a refusal changed the state")
			}
		})
	}
	for _, p := range []*Policy{stack, post} {
		if err := CanPace(p); !errors.Is(err, ErrCannotPace) {
			t.Errorf("CanPace(%v): got %v, want ErrCannotPace", p.Kind, err)
		}
	}
	for _, p := range []*Policy{phased, fixed} {
		if err := CanPace(p); err != nil {
			t.Errorf("CanPace(%v): %v", p.Kind, err)
		}
	}
}

// TestReservePruning: a reservation does not prune what the present still
// counts. Limit 2 per second: hits at 0 and 0.5 s; a reservation at 1.4 s
// (after the first hit left) must leave the hit at 0.5 counted at 0.6 s,
// so a request then is rejected.
func TestReservePruning(t *testing.T) {
	p := &Policy{Tiers: []Tier{{Limit: 2, Window: time.Second, Active: Unbounded}}}
	s := &State{}
	t0 := time.Unix(1000, 0)
	Request(p, s, nil, t0, 1, 1)
	Request(p, s, nil, t0.Add(500*time.Millisecond), 1, 1)
	now := t0.Add(600 * time.Millisecond)
	if d := Reserve(p, s, nil, now, t0.Add(1400*time.Millisecond), 1, 1); !d.OK {
		t.Fatalf("reservation refused: %+v", d)
	}
	if d := Request(p, s, nil, now, 1, 1); d.OK {
		t.Fatalf("a request at 0.6 s granted beside the hit at 0.5 s and the reservation: %+v", d)
	}
	// Giving the reservation back frees exactly its slot.
	RefundReserved(p, s, nil, now, t0.Add(1400*time.Millisecond), 1)
	if d := Request(p, s, nil, t0.Add(1100*time.Millisecond), 1, 1); !d.OK {
		t.Fatalf("after the give-back, a request at 1.1 s is refused: %+v", d)
	}
}

func cmpState(a, b *State) bool {
	return len(a.tiers) == len(b.tiers) && a.second.sum == b.second.sum && a.val == b.val && a.at == b.at &&
		(len(a.tiers) == 0 || a.tiers[0].hits.sum == b.tiers[0].hits.sum)
}

// TestBucketGiveBack: the counter-example of reserve.go (capacity 2, 1
// credit a second): adding R1's credit back would let a credit go at 2s
// beside R2's two, so nothing comes back; a give-back of the latest
// reservation, or of an earlier one when no later one saw the bucket
// full, restores its credit, which the next request can reserve by R2's
// instant (not at R1's: one balance cannot say that R1's instant is free
// and R2's taken).
func TestBucketGiveBack(t *testing.T) {
	p := &Policy{Kind: KindTokenBucket, Bucket: TokenBucket{Capacity: 2, Refill: 1, Per: time.Second}}
	t0 := time.Unix(1000, 0)
	sec := func(f float64) time.Time { return t0.Add(time.Duration(f * float64(time.Second))) }
	reserve := func(s *State, at float64, k int64, want bool) {
		t.Helper()
		if d := Reserve(p, s, nil, t0, sec(at), k, k); d.OK != want {
			t.Fatalf("reserve %d at %vs: got %+v, want OK %v", k, at, d, want)
		}
	}
	t.Run("clipped", func(t *testing.T) {
		s := &State{}
		Request(p, s, nil, t0, 1, 1)
		reserve(s, 1, 1, true) // R1: the bucket is full at 1s
		reserve(s, 2, 2, true) // R2: full again at 2s
		RefundReserved(p, s, nil, sec(0.25), sec(1), 1)
		if d := PeekReserve(p, s, nil, sec(0.25), sec(2), 1, 1); d.OK {
			t.Fatalf("after R1's give-back, a credit at 2s beside R2's two: %+v", d)
		}
	})
	for _, tc := range []struct {
		name   string
		cancel float64 // the reservation given back: R1 at 1s or R2 at 2s
	}{{"latest", 2}, {"earlier, nothing clipped", 1}} {
		t.Run(tc.name, func(t *testing.T) {
			s := &State{}
			Request(p, s, nil, t0, 2, 2)
			reserve(s, 1, 1, true) // R1
			reserve(s, 2, 1, true) // R2
			reserve(s, 2, 1, false)
			RefundReserved(p, s, nil, sec(0.5), sec(tc.cancel), 1)
			if d := Reserve(p, s, nil, sec(0.5), sec(2), 1, 1); !d.OK {
				t.Fatalf("the credit given back is not reserved again: %+v", d)
			}
			if d := PeekReserve(p, s, nil, sec(0.5), sec(2), 1, 1); d.OK {
				t.Fatalf("a third credit by 2s: %+v", d)
			}
		})
	}
	t.Run("due", func(t *testing.T) {
		s := &State{}
		Request(p, s, nil, t0, 2, 2)
		reserve(s, 1, 1, true)
		before := cloneState(s)
		RefundReserved(p, s, nil, sec(1), sec(1), 1)
		if !cmpState(before, s) {
			t.Fatalf("a reservation already due was given back")
		}
	})
}

// TestPaceBurstFixed: a fixed window of 5 a second; a burst of 10 in its
// last 100 ms: 5 granted at once, 5 reserved in the next window (its count
// starts with them: a request there is refused), all at its start; a
// cancelled one frees its place for the next request.
func TestPaceBurstFixed(t *testing.T) {
	p := &Policy{Kind: KindFixedWindow, Window: FixedWindow{Limit: 5, Unit: UnitSecond}}
	s := &State{}
	now := time.Unix(1000, 900_000_000)
	var as []answer
	for i := range 10 {
		at := now.Add(time.Duration(i) * time.Millisecond)
		d := Request(p, s, nil, at, 1, 1)
		if d.OK {
			as = append(as, answer{at: at.UnixMicro(), n: 1, seq: i})
			continue
		}
		if i < 5 || d.RetryAfter != time.Duration(100-i)*time.Millisecond {
			t.Fatalf("request %d: %+v", i, d)
		}
		rd := Reserve(p, s, nil, at, at.Add(d.RetryAfter), 1, 1)
		if !rd.OK || rd.Remaining != int64(9-i) || rd.ResetAfter != time.Second {
			t.Fatalf("request %d: reservation in the next window: %+v", i, rd)
		}
		as = append(as, answer{at: at.Add(d.RetryAfter).UnixMicro(), n: 1, seq: i, paced: true})
	}
	checkAnswers(t, p, as)
	for i, a := range as[5:] {
		if a.at != time.Unix(1001, 0).UnixMicro() {
			t.Errorf("request %d answered at %v", i+5, time.UnixMicro(a.at))
		}
	}
	later := time.Unix(1000, 950_000_000)
	if d := Reserve(p, s, nil, later, time.Unix(1001, 0), 1, 1); d.OK {
		t.Fatalf("a sixth hit reserved in the next window: %+v", d)
	}
	RefundReserved(p, s, nil, later, time.Unix(1001, 0), 1)
	if d := Reserve(p, s, nil, later, time.Unix(1001, 0), 1, 1); !d.OK {
		t.Fatalf("the place given back is not reserved again: %+v", d)
	}
	if d := Request(p, s, nil, time.Unix(1001, 500_000), 1, 1); d.OK {
		t.Fatalf("a request in the next window beside its 5 reserved hits: %+v", d)
	}
	if at, want := ForgetAt(p, s), time.Unix(1002, 0); !at.Equal(want) {
		t.Fatalf("ForgetAt %v, want %v (the end of the window reserved in)", at, want)
	}
}
