package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/charonlimit/charon/internal/redistest"
	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/tiers"
)

// TestOneTierPath demands of the one-tier path (one1 in decide.lua) the
// same answers, stored states and expiry times as the general decision on
// the same calls: the library is loaded a second time with that path cut
// off, and random calls of one item, mostly of one-tier policies, go to
// both on keys of their own.
func TestOneTierPath(t *testing.T) {
	_, c := singleClient(t)
	ctx := context.Background()
	const cut = "if p.one and gk == 0 then"
	if !strings.Contains(decideLua, cut) {
		t.Fatal("decide.lua has no one-tier path to cut off")
	}
	ref := strings.Replace(decideLua, cut, "if false then", 1)
	refVersion := libHash(ref)
	for _, code := range []string{libraryCode, strings.ReplaceAll(ref, "@V@", refVersion)} {
		if err := c.FunctionLoadReplace(ctx, code).Err(); err != nil {
			t.Fatal(err)
		}
	}
	fns := []string{funcName, "charon_decide_" + refVersion}

	r := rand.New(rand.NewPCG(7, 11))
	randTier := func() tiers.Tier {
		tr := tiers.Tier{Limit: 1 + r.Int64N(8), Window: randDur(r, time.Millisecond, 3*time.Second), Active: tiers.Unbounded}
		switch r.IntN(3) {
		case 1:
			tr.Limit = 1 + r.Int64N(2000)
		case 2:
			tr.Limit = 60 + r.Int64N(10)
		}
		if r.IntN(2) == 0 {
			tr.Active = tr.Window * time.Duration(1+r.IntN(5))
		}
		switch r.IntN(4) {
		case 1:
			tr.Cooldown = randDur(r, time.Microsecond, 5*time.Second)
		case 2:
			tr.Cooldown = tr.Window * time.Duration(r.IntN(4))
		case 3:
			if r.IntN(3) == 0 {
				tr.Cooldown = tiers.Unbounded
			}
		}
		tr.Skippable = r.IntN(3) == 0
		return tr
	}
	randPolicy := func() *tiers.Policy {
		p := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{randTier()}}
		switch r.IntN(8) {
		case 0: // a state of more tiers on the same key
			p.Tiers = append(p.Tiers, randTier())
		case 1:
			p.HardLimit = 1 + r.Int64N(100)
		case 2:
			p.Kind, p.Bucket = tiers.KindTokenBucket, tiers.TokenBucket{Capacity: 1 + r.Int64N(200), Refill: 1 + r.Int64N(50), Per: time.Second}
		}
		q, _ := tiers.Normalize(*p)
		return &q
	}

	// Future times, so that no state expires on Redis's clock during the
	// test.
	start := time.Now().Add(time.Hour).UnixMicro()
	calls, granted := 0, 0
	for trace := range 300 {
		pols := []*tiers.Policy{randPolicy()}
		if r.IntN(4) == 0 {
			pols = append(pols, randPolicy())
		}
		now := start + r.Int64N(int64(time.Hour/time.Microsecond))
		for step := range 60 {
			switch r.IntN(10) {
			case 0:
			case 1:
				now += r.Int64N(10_000_000)
			case 2:
				now -= r.Int64N(5000)
			default:
				now += r.Int64N(300_000)
			}
			p := pols[0]
			if r.IntN(10) == 0 {
				p = pols[r.IntN(len(pols))]
			}
			hits := 1 + r.Int64N(4)
			if r.IntN(5) == 0 {
				hits = r.Int64N(2500)
			}
			mn := r.Int64N(hits + 1)
			if r.IntN(20) == 0 {
				mn = hits + 1
			}
			var f int64
			if r.IntN(8) == 0 {
				f = 2 // shadow
			}
			maxTTL := int64(3_600_000)
			if r.IntN(10) == 0 {
				maxTTL = 1 + r.Int64N(3000)
			}
			var h []byte
			for _, v := range []int64{modeDecide, now, maxTTL, 1000, 1, 1, 1, 0, 1, hits, mn, f} {
				h = appendF64(h, v)
			}
			arg := encodePolicy(p).arg
			var replies, states []string
			var expiry []int64
			for i, fn := range fns {
				key := fmt.Sprintf("onetier:%d:%d", i, trace)
				rep, err := c.Do(ctx, "fcall", fn, 1, key, string(h), "", arg).Text()
				if err != nil {
					t.Fatalf("trace %d step %d: %s: %v", trace, step, fn, err)
				}
				st, err := c.Get(ctx, key).Result()
				if err != nil && err.Error() != "redis: nil" {
					t.Fatal(err)
				}
				exp, err := c.Do(ctx, "pexpiretime", key).Int64()
				if err != nil {
					t.Fatal(err)
				}
				replies, states, expiry = append(replies, rep), append(states, st), append(expiry, exp)
			}
			calls++
			rd := &reader{b: replies[1][16:]}
			if rd.num()&1 != 0 {
				granted++
			}
			if replies[0] != replies[1] || states[0] != states[1] || expiry[0] != expiry[1] {
				t.Fatalf("trace %d step %d: policy %+v, now %d, hits %d, min %d, flags %d:\nreply %x\n  ref %x\nstate %x\n  ref %x\nexpiry %d, ref %d",
					trace, step, *p, now, hits, mn, f, replies[0], replies[1], states[0], states[1], expiry[0], expiry[1])
			}
		}
	}
	t.Logf("%d calls, %d granted", calls, granted)
}

// TestOneTierCost measures what the one-tier path saves Redis on
// TestScriptCostBench's workload: the store (pipelined) deciding one item
// per call of the bench policy (one tier of 1000 per second, no hard or
// global limit) on the Redis clock, 10,000 domains whose states are
// present, 8 callers in parallel. The library is loaded a second time with
// the path cut off, and the two take turns, ABBA, for CHARON_COST_ROUNDS
// rounds of 20,000 calls each, so that the machine's drift weighs on both
// alike. It logs, per round and as medians, Redis' time per FCALL (INFO
// commandstats) and Redis' CPU per call (INFO cpu, the whole server). A
// measurement, not a check: it runs only with CHARON_COST_ROUNDS set.
func TestOneTierCost(t *testing.T) {
	if os.Getenv("CHARON_COST_ROUNDS") == "" {
		t.Skip("a measurement of 30+ s: set CHARON_COST_ROUNDS (e.g. 16) to run it")
	}
	rounds := 16
	fmt.Sscan(os.Getenv("CHARON_COST_ROUNDS"), &rounds)
	n, c := singleClient(t)
	ctx := context.Background()
	const cut = "if p.one and gk == 0 then"
	ref := strings.Replace(decideLua, cut, "if false then", 1)
	refVersion := libHash(ref)
	for _, code := range []string{libraryCode, strings.ReplaceAll(ref, "@V@", refVersion)} {
		if err := c.FunctionLoadReplace(ctx, code).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// The store calls the function funcNameArg names: the rounds switch it
	// while no call is in flight.
	fns := []any{funcNameArg, "charon_decide_" + refVersion}
	t.Cleanup(func() { funcNameArg = fns[0] })
	names := []string{"one-tier path", "general path"}

	s := testStore(t, c, Options{})
	p := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 1000, Window: time.Second, Active: tiers.Unbounded}}}
	const domains, calls, workers = 10000, 20000, 8
	items := make([]store.Item, domains)
	for i := range items {
		items[i] = store.Item{Key: store.Key{Resource: "bench/key=value", Domain: fmt.Sprint("user", i), PolicyID: 1}, Policy: p, Hits: 1, Min: 1}
	}
	out := make([]tiers.Decision, 1)
	for i := range items {
		if err := s.Decide(ctx, time.Time{}, items[i:i+1], out); err != nil || !out[0].OK {
			t.Fatalf("domain %d: %v %+v", i, err, out[0])
		}
	}
	var perCall, cpu [2][]float64
	for round := range rounds {
		for k := range 2 {
			v := k
			if round%2 == 1 {
				v = 1 - k
			}
			funcNameArg = fns[v]
			if _, err := redistest.CLI(n.Port, "config", "resetstat"); err != nil {
				t.Fatal(err)
			}
			cpu0 := redisCPU(t, n.Port)
			var wg sync.WaitGroup
			for w := range workers {
				wg.Go(func() {
					r := rand.New(rand.NewPCG(uint64(round), uint64(w)))
					out := make([]tiers.Decision, 1)
					for range calls / workers {
						i := r.IntN(domains)
						if err := s.Decide(ctx, time.Time{}, items[i:i+1], out); err != nil || !out[0].OK {
							t.Errorf("domain %d: %v %+v", i, err, out[0])
							return
						}
					}
				})
			}
			wg.Wait()
			if t.Failed() {
				t.FailNow()
			}
			us, ok := fcallMicros(n.Port)
			if !ok {
				t.Fatal("no FCALL in INFO commandstats")
			}
			perCPU := (redisCPU(t, n.Port) - cpu0) * 1e6 / calls
			perCall[v], cpu[v] = append(perCall[v], us), append(cpu[v], perCPU)
			t.Logf("round %d, %s: %.2f µs per FCALL, %.2f µs of Redis CPU per call", round, names[v], us, perCPU)
		}
	}
	med := func(xs []float64) float64 {
		s := slices.Clone(xs)
		slices.Sort(s)
		if len(s)%2 == 1 {
			return s[len(s)/2]
		}
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	saving := func(what string, x [2][]float64) {
		var saved []float64
		for i := range x[0] {
			saved = append(saved, 100*(x[1][i]-x[0][i])/x[1][i])
		}
		a, b := med(x[0]), med(x[1])
		t.Logf("%s, medians over %d rounds: one-tier path %.2f µs, general path %.2f µs: %.1f%% less (a round's saving: median %.1f%%, %.1f%% to %.1f%%)",
			what, rounds, a, b, 100*(b-a)/b, med(saved), slices.Min(saved), slices.Max(saved))
	}
	saving("Redis time per FCALL", perCall)
	saving("Redis CPU per call", cpu)
}

// redisCPU returns the CPU seconds the Redis server has used (INFO cpu:
// used_cpu_user + used_cpu_sys).
func redisCPU(t *testing.T, port int) float64 {
	out, err := redistest.CLI(port, "info", "cpu")
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, l := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(l), ":")
		if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			sum += f
		}
	}
	return sum
}
