package escrow

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/charonlimit/charon/internal/redistest"
	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/redisstore"
	"github.com/charonlimit/charon/tiers"
)

// answer is a committed grant: hits granted at t.
type answer struct {
	t    time.Time
	hits int64
}

// traceRule is one pair of a trace and the limits it is checked against;
// a hot pair is asked for most.
type traceRule struct {
	it  store.Item
	hot bool
}

// replica is one escrow store of a trace, with the recorder it leases
// through and the hits its answers granted.
type replica struct {
	s       *Store
	rec     *recorder
	granted map[store.Key]int64
	dead    bool
}

// runTrace plays a random trace of requests, ticks, clock steps and
// replica crashes (a crashed replica is dropped without Close: its leases
// stay counted) on three replicas sharing shared. A pair is leased from
// ten decisions per lease on one replica (minUses; 200 a second for the
// 50ms leases of a 1s window), so the requests come in bursts, dense
// enough on the clock that the hot pairs enter escrow on every replica,
// and the 1s windows turn over a few times. It checks:
//   - no window of any limit (tier, hard, global) holds more committed
//     answers than the limit;
//   - once every live replica has closed, each gave back exactly what its
//     leases did not grant: its leases keep the hits it granted locally;
//     a crashed replica's keep at least those;
//   - the shared store counts exactly the hits answered plus what crashed
//     replicas' leases held unused (the trace is shorter than the
//     windows, so nothing has left them);
//   - leases were taken and granted hits: a trace that never leaves the
//     shared path would check nothing of escrow.
func runTrace(t *testing.T, seed uint64, shared Leaser, prefix string) {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	clk := newClock()
	long := 30 * time.Second // longer than the trace: the final count sees everything
	hard := sliding(400, long)
	hard.HardLimit = 60
	global := sliding(400, long)
	global.GlobalLimit = 80
	key := func(res, dom string, p *tiers.Policy) store.Item {
		return store.Item{Key: store.Key{Resource: prefix + res, Domain: dom, PolicyID: 1}, Policy: p}
	}
	rules := []traceRule{
		{key("a", "x", sliding(300, long)), true},
		{key("b", "x", sliding(80, time.Second)), true},
		{key("c", "x", sliding(40, time.Second)), true},
		{key("h", "x", hard), true},
		{key("g", "x", global), true},
		{key("g", "y", global), false},                  // its global limit shared with a leased pair
		{key("big", "x", sliding(100_000, long)), true}, // never full: leases grant
		{key("cold", "x", sliding(5, long)), false},
	}
	var hot []int
	for k, r := range rules {
		if r.hot {
			hot = append(hot, k)
		}
	}
	answers := make([][]answer, len(rules))
	newReplica := func() *replica {
		rec := newRecorder(patient{shared})
		s, err := New(Options{Remote: rec, Default: true, Now: clk.Now, Lease: 100 * time.Millisecond, Threshold: 3, Size: SizeDemand})
		if err != nil {
			t.Fatal(err)
		}
		return &replica{s: s, rec: rec, granted: map[store.Key]int64{}}
	}
	var all []*replica
	live := make([]*replica, 3)
	for i := range live {
		live[i] = newReplica()
		all = append(all, live[i])
	}
	ctx := context.Background()
	// About 3s on the clock, 150 ticks and 2 crashes per replica, and
	// 10,000 requests of 1.5 items.
	steps := 3000
	for range steps {
		r := live[rng.IntN(len(live))]
		switch x := rng.IntN(1000); {
		case x < 100:
			clk.Add(time.Duration(rng.IntN(21)) * time.Millisecond)
		case x < 250:
			r.s.Tick(ctx)
		case x < 252:
			// A crash: the replica's leases stay with the shared store.
			r.dead = true
			i := 0
			for live[i] != r {
				i++
			}
			live[i] = newReplica()
			all = append(all, live[i])
		default:
			// A burst of requests at one instant.
			for range 1 + rng.IntN(8) {
				n := 1 + rng.IntN(2)
				idx := make([]int, 0, n)
				items := make([]store.Item, 0, n)
				for range n {
					k := rng.IntN(len(rules))
					if rng.IntN(3) > 0 {
						k = hot[rng.IntN(len(hot))] // mostly the hot ones
					}
					it := rules[k].it
					it.Hits = int64(1 + rng.IntN(3))
					it.Min = it.Hits
					switch rng.IntN(12) {
					case 0:
						it.Min = 1 // copies with a minimum
					case 1:
						it.Hits, it.Min = 0, 0 // a check
					}
					idx = append(idx, k)
					items = append(items, it)
				}
				now := clk.Now()
				out := make([]tiers.Decision, len(items))
				if err := r.s.Decide(ctx, now, items, out); err != nil {
					t.Fatalf("seed %d: decide: %v", seed, err)
				}
				for j := range items {
					// A check alone is granted; beside a take of its pair it
					// has the take's answer.
					alone := true
					for k := range items {
						alone = alone && (k == j || items[k].Key != items[j].Key)
					}
					if items[j].Hits == 0 && alone && !out[j].OK {
						t.Fatalf("seed %d: a check was rejected: %+v", seed, out[j])
					}
				}
				if committed(items, out) {
					for j, k := range idx {
						if out[j].OK && out[j].Granted > 0 {
							answers[k] = append(answers[k], answer{now, out[j].Granted})
							r.granted[items[j].Key] += out[j].Granted
						}
					}
				}
			}
		}
	}
	checkLimits(t, seed, rules, answers, global.GlobalLimit)

	// Every live replica's leases end and are given back.
	clk.Add(time.Second)
	for _, r := range live {
		r.s.Tick(ctx)
		r.s.Close()
	}
	isLong := func(k store.Key) bool {
		for _, r := range rules {
			if r.it.Key == k {
				return r.it.Policy.Tiers[0].Window >= long
			}
		}
		return false
	}
	var leases, local uint64
	for _, r := range all {
		st := r.s.Stats()
		leases += st.Leases
		local += st.LocalGranted
	}
	if leases == 0 || local == 0 {
		t.Fatalf("seed %d: %d leases, %d requests granted from them: the trace never left the shared path", seed, leases, local)
	}
	var deadHeld int64
	for i, r := range all {
		_, _, remote := r.rec.stats(nil)
		var local int64
		for _, n := range r.granted {
			local += n
		}
		local -= remote
		held := r.rec.held(nil)
		switch {
		case r.dead && held < local:
			t.Fatalf("seed %d: crashed replica %d: its leases keep %d hits, it granted %d from them", seed, i, held, local)
		case !r.dead && held != local:
			t.Fatalf("seed %d: replica %d: its leases keep %d hits, it granted %d from them (stats %+v)", seed, i, held, local, r.s.Stats())
		}
		if r.dead {
			_, _, remote := r.rec.stats(isLong)
			var local int64
			for k, n := range r.granted {
				if isLong(k) {
					local += n
				}
			}
			deadHeld += r.rec.held(isLong) - (local - remote)
		}
	}
	// The pairs whose window is longer than the trace: the shared store
	// counts what was answered, and what crashed replicas held unused.
	var counted, answered int64
	for k, r := range rules {
		if !isLong(r.it.Key) {
			continue
		}
		for _, a := range answers[k] {
			answered += a.hits
		}
		counted += count(t, shared, clk.Now(), r.it)
	}
	if counted != answered+deadHeld {
		t.Fatalf("seed %d: the shared store counts %d hits; %d were answered, crashed replicas' leases held %d unused", seed, counted, answered, deadHeld)
	}
}

// checkLimits fails t when a window of any limit of rules (its tier's,
// its hard limit's, and globalLimit over the answers of every rule with a
// global limit) holds more answered hits than the limit: answers[k] are
// rule k's.
func checkLimits(t *testing.T, seed uint64, rules []traceRule, answers [][]answer, globalLimit int64) {
	t.Helper()
	// The hits answered in the window from each answer's instant, by a
	// sweep over the answers in time order.
	window := func(name string, as []answer, w time.Duration, limit int64) {
		as = slices.Clone(as)
		slices.SortStableFunc(as, func(a, b answer) int { return a.t.Compare(b.t) })
		var n int64 // the hits of as[i:end]
		end := 0
		for i := range as {
			for end < len(as) && as[end].t.Sub(as[i].t) < w {
				n += as[end].hits
				end++
			}
			if n > limit {
				t.Fatalf("seed %d: %s: %d hits answered in the %v from %v, limit %d", seed, name, n, w, as[i].t, limit)
			}
			n -= as[i].hits
		}
	}
	for k, r := range rules {
		tr := r.it.Policy.Tiers[0]
		window(r.it.Key.Resource+"/"+r.it.Key.Domain, answers[k], effective(tr.Window, tr.Limit), tr.Limit)
		if h := r.it.Policy.HardLimit; h > 0 {
			window("hard "+r.it.Key.Resource, answers[k], effective(time.Second, h), h)
		}
	}
	var g []answer
	for k, r := range rules {
		if r.it.Policy.GlobalLimit > 0 {
			g = append(g, answers[k]...)
		}
	}
	window("global", g, effective(time.Second, globalLimit), globalLimit)
}

// patient is a Leaser that lets every call run to its answer: it drops
// the caller's deadline. Escrow bounds each leaser call on the wall clock
// (a lease length, a second at Close), and a call that times out may have
// been applied or not: its hits stay counted, which is right but which the
// trace's exact accounting (what was reserved less what was given back)
// cannot tell from a lost give-back. On a loaded machine a Redis call can
// take longer than a lease of 100ms; the trace is of the protocol, not of
// timeouts.
type patient struct{ Leaser }

func (p patient) Decide(ctx context.Context, now time.Time, items []store.Item, out []tiers.Decision) error {
	return p.Leaser.Decide(context.WithoutCancel(ctx), now, items, out)
}

func (p patient) Reserve(ctx context.Context, now time.Time, after time.Duration, items []store.Item, out []tiers.Decision) (time.Time, error) {
	return p.Leaser.Reserve(context.WithoutCancel(ctx), now, after, items, out)
}

func (p patient) GiveBack(ctx context.Context, now, at time.Time, items []store.Item) error {
	return p.Leaser.GiveBack(context.WithoutCancel(ctx), now, at, items)
}

// effective is the window a store enforces a limit over: above 64 hits a
// window is counted in 64 buckets, and a hit is counted while younger than
// the window less a bucket plus 1µs (package tiers, "A hit log"), on the
// shared path and in a lease alike.
func effective(w time.Duration, limit int64) time.Duration {
	if limit <= 64 {
		return w
	}
	b := (w.Microseconds() + 63) / 64
	return w - time.Duration(b)*time.Microsecond + time.Microsecond
}

// TestTracesMemory runs random traces on the memory store.
func TestTracesMemory(t *testing.T) {
	n := 50
	if testing.Short() {
		n = 10
	}
	for seed := range uint64(n) {
		runTrace(t, seed, newMem(t), "")
	}
}

// TestTracesRedis runs random traces on Redis, one node and a Cluster of
// three, on the caller's clock.
func TestTracesRedis(t *testing.T) {
	for _, name := range []string{"single", "cluster"} {
		t.Run(name, func(t *testing.T) {
			var shared *redisstore.Store
			var err error
			if name == "single" {
				n := redistest.Single(t)
				shared, err = redisstore.NewWithClient(redistest.Client(t, n), redisstore.Options{Clock: redisstore.ClockCaller})
			} else {
				nodes := redistest.Cluster(t, 3)
				shared, err = redisstore.NewWithClient(redistest.ClusterClient(t, nodes), redisstore.Options{Clock: redisstore.ClockCaller, Cluster: true})
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { shared.Close() })
			n := 3 // a trace makes about 10,000 calls
			if testing.Short() {
				n = 1
			}
			for seed := range uint64(n) {
				runTrace(t, seed, shared, fmt.Sprintf("s%d/", seed))
			}
		})
	}
}
