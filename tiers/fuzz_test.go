package tiers

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// bytesource decodes fuzz input; it yields zeros when exhausted.
type bytesource struct{ b []byte }

func (r *bytesource) next() int {
	if len(r.b) == 0 {
		return 0
	}
	v := int(r.b[0])
	r.b = r.b[1:]
	return v
}

func (r *bytesource) empty() bool { return len(r.b) == 0 }

// genPolicy draws a KindTiers policy; big allows limits above exactMax.
func genPolicy(r *bytesource, big bool) *Policy {
	p := &Policy{}
	n := r.next() % 5
	for range n {
		t := Tier{
			Limit:     int64(1 + r.next()%8),
			Window:    time.Duration(1+r.next()%20) * 100 * time.Millisecond,
			Cooldown:  time.Duration(r.next()%4) * 700 * time.Millisecond,
			Skippable: r.next()%2 == 1,
		}
		if big && r.next()%2 == 1 {
			t.Limit = int64(60 + r.next()*2)
		}
		switch a := r.next() % 4; a {
		case 0:
			t.Active = Unbounded
		default:
			t.Active = t.Window * time.Duration(a)
		}
		p.Tiers = append(p.Tiers, t)
	}
	if v := r.next() % 4; v == 1 {
		p.HardLimit = int64(1 + r.next()%12)
	} else if v == 2 && big {
		p.HardLimit = int64(60 + r.next())
	}
	if v := r.next() % 4; v == 1 {
		p.GlobalLimit = int64(1 + r.next()%16)
	} else if v == 2 && big {
		p.GlobalLimit = int64(60 + r.next())
	}
	return p
}

var stateOpts = cmp.Options{
	cmp.AllowUnexported(State{}, tierState{}, hitLog{}, entry{}, Global{}),
	cmpopts.EquateEmpty(),
}

func cloneLog(l hitLog) hitLog {
	return hitLog{e: append([]entry(nil), l.e...), h: l.h, sum: l.sum}
}

func cloneState(s *State) *State {
	c := *s
	c.tiers = append([]tierState(nil), s.tiers...)
	for i := range c.tiers {
		c.tiers[i].hits = cloneLog(s.tiers[i].hits)
	}
	c.second = cloneLog(s.second)
	return &c
}

func cloneGlobal(g *Global) *Global {
	c := *g
	c.second = cloneLog(g.second)
	return &c
}

// rebucket rebuilds an exact log with the widths the policy gives.
func rebucket(l hitLog, w, b int64) hitLog {
	var out hitLog
	for _, e := range l.buckets() {
		out.add(e.at, w, b, e.n)
	}
	return out
}

// toBuckets converts a state kept exact into the representation the package
// uses by default, from the same history.
func toBuckets(p *Policy, s *State, g *Global) (*State, *Global) {
	c := cloneState(s)
	c.exact = false
	for i := range c.tiers {
		if i >= len(p.Tiers) {
			break
		}
		w := Micros(p.Tiers[i].Window)
		c.tiers[i].hits = rebucket(s.tiers[i].hits, w, tierWidth(p.Tiers[i].Limit, w, false))
	}
	c.second = rebucket(s.second, second, secondWidth(p.HardLimit, false))
	gc := cloneGlobal(g)
	gc.exact = false
	gc.second = rebucket(g.second, second, secondWidth(p.GlobalLimit, false))
	return c, gc
}

type grant struct{ at, n int64 }

// activation is the hits granted into one tier since it was last entered.
type activation struct {
	in      bool
	entered int64
	hits    []int64
}

func FuzzTiersInvariants(f *testing.F) {
	f.Add([]byte{2, 3, 5, 0, 0, 0, 7, 2, 1, 1, 0, 1, 3, 9, 3, 3, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10})
	f.Add([]byte{1, 0, 9, 0, 1, 0, 0, 0, 0, 200, 3, 3, 0, 1, 1, 0, 0, 0})
	f.Add([]byte{4, 7, 3, 2, 1, 1, 0, 1, 1, 0, 3, 5, 4, 3, 1, 2, 2, 1, 1, 3, 9, 9, 1, 200, 100, 40, 30, 20, 10, 1, 2, 3})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := &bytesource{b: data}
		p := genPolicy(r, false)
		checkTrace(t, r, p, true)
	})
}

func FuzzBucketsLenient(f *testing.F) {
	f.Add([]byte{2, 3, 5, 0, 1, 30, 1, 0, 1, 3, 2, 1, 1, 2, 200, 1, 3, 9, 3, 3, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10})
	f.Add([]byte{1, 0, 9, 0, 1, 1, 250, 0, 2, 100, 2, 90, 200, 3, 3, 0, 1, 1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := &bytesource{b: data}
		p := genPolicy(r, true)
		checkTrace(t, r, p, false)
	})
}

// checkTrace replays requests from r against p with exact states (two
// domains sharing a Global) and checks every invariant of the package;
// checkLimits also checks the window and hard limits over the history
// (meaningless when limits are large enough to be bucketed by default,
// since the states are forced exact).
func checkTrace(t *testing.T, r *bytesource, p *Policy, checkLimits bool) {
	states := [2]*State{{exact: true}, {exact: true}}
	g := &Global{exact: true}
	var grants [2][]grant
	acts := [2][]activation{make([]activation, len(p.Tiers)), make([]activation, len(p.Tiers))}
	now := t0.UnixMicro()
	for step := 0; step < 200 && !r.empty(); step++ {
		switch v := r.next(); {
		case v < 128:
			now += int64(v) * 10_000
		case v < 160:
			now += int64(v - 128)
		}
		dom := r.next() % 2
		s := states[dom]
		k := int64(1 + r.next()%6)
		m := int64(1 + r.next()%int(k))
		at := time.UnixMicro(now)

		// Bucketed states built from the same history never grant less.
		bs, bg := toBuckets(p, s, g)
		before, gbefore := cloneState(s), cloneGlobal(g)
		peek := Peek(p, s, g, at, k, m)
		if diff := cmp.Diff(before, s, stateOpts); diff != "" {
			t.Fatalf("step %d: Peek changed the state:\n%s", step, diff)
		}
		bd := Peek(p, bs, bg, at, k, m)
		d := Request(p, s, g, at, k, m)
		if diff := cmp.Diff(peek, d); diff != "" {
			t.Fatalf("step %d: Peek and Request differ (-peek +request):\n%s", step, diff)
		}
		if bd.Granted < d.Granted || (d.OK && !bd.OK) {
			t.Fatalf("step %d: bucketed granted %d (ok %v), exact %d (ok %v); policy %+v", step, bd.Granted, bd.OK, d.Granted, d.OK, p)
		}
		if !d.OK {
			if diff := cmp.Diff(before, s, stateOpts); diff != "" {
				t.Fatalf("step %d: a rejection changed the state:\n%s", step, diff)
			}
			if diff := cmp.Diff(gbefore, g, stateOpts); diff != "" {
				t.Fatalf("step %d: a rejection changed the global state:\n%s", step, diff)
			}
			if d.Granted != 0 || d.RetryAfter <= 0 || d.ResetAfter != d.RetryAfter {
				t.Fatalf("step %d: rejection %+v", step, d)
			}
			if d.RetryAfter != Unbounded {
				ra := d.RetryAfter.Microseconds()
				if got := Peek(p, s, g, time.UnixMicro(now+ra), k, m); !got.OK {
					t.Fatalf("step %d: not granted at retry_after %v: %+v", step, d.RetryAfter, got)
				}
				if got := Peek(p, s, g, time.UnixMicro(now+ra-1), k, m); got.OK {
					t.Fatalf("step %d: granted 1µs before retry_after %v", step, d.RetryAfter)
				}
				if got := Peek(p, s, g, time.UnixMicro(now+ra), 1, 1); !got.OK {
					t.Fatalf("step %d: one hit not granted at retry_after %v", step, d.RetryAfter)
				}
			}
		} else {
			if d.Granted < m || d.Granted > k || d.RetryAfter != 0 {
				t.Fatalf("step %d: grant %+v for copies %d min %d", step, d, k, m)
			}
			grants[dom] = append(grants[dom], grant{now, d.Granted})
		}

		// Remaining single hits follow at the same instant.
		cs, cg := cloneState(s), cloneGlobal(g)
		var singles int64
		for singles <= d.Remaining && Request(p, cs, cg, at, 1, 1).OK {
			singles++
		}
		if singles != d.Remaining {
			t.Fatalf("step %d: remaining %d, but %d single hits were granted", step, d.Remaining, singles)
		}
		if g := ForgetAt(p, s); !g.IsZero() && g.Before(at) && d.OK {
			t.Fatalf("step %d: ForgetAt %v before a grant at %v", step, g, at)
		}
		if !checkLimits || !d.OK {
			continue
		}
		// Per-tier window limits within each activation.
		for i := range p.Tiers {
			if i >= len(s.tiers) {
				break
			}
			a := &acts[dom][i]
			ts := &s.tiers[i]
			w := Micros(p.Tiers[i].Window)
			added := ts.hits.count(now, w)
			if !a.in || a.entered != ts.entered {
				*a = activation{in: ts.in, entered: ts.entered}
			} else if i < len(before.tiers) {
				added -= before.tiers[i].hits.count(now, w)
			}
			for range added {
				a.hits = append(a.hits, now)
			}
			for _, h := range a.hits {
				var n int64
				for _, x := range a.hits {
					if x >= h && x-h < w {
						n++
					}
				}
				if n > p.Tiers[i].Limit {
					t.Fatalf("step %d: tier %d holds %d hits in a window from %d, limit %d", step, i+1, n, h, p.Tiers[i].Limit)
				}
			}
		}
		if p.HardLimit > 0 {
			var n int64
			for _, gr := range grants[dom] {
				if now-gr.at < second {
					n += gr.n
				}
			}
			if n > p.HardLimit {
				t.Fatalf("step %d: %d hits in a second, hard limit %d", step, n, p.HardLimit)
			}
		}
		if p.GlobalLimit > 0 {
			var n int64
			for _, gs := range grants {
				for _, gr := range gs {
					if now-gr.at < second {
						n += gr.n
					}
				}
			}
			if n > p.GlobalLimit {
				t.Fatalf("step %d: %d hits in a second, global limit %d", step, n, p.GlobalLimit)
			}
		}
	}
}
