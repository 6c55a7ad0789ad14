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

// The measurements below log what Redis spends on a decision. They check
// nothing but that the calls succeed, and run only with CHARON_COST_ROUNDS
// set (BenchmarkScriptCost only as a benchmark).

// costRounds returns CHARON_COST_ROUNDS, the number of rounds of a
// measurement, and skips the test, saying why, when it is not set.
func costRounds(t *testing.T, skip string) int {
	t.Helper()
	rounds, _ := strconv.Atoi(os.Getenv("CHARON_COST_ROUNDS"))
	if rounds <= 0 {
		t.Skip(skip)
	}
	return rounds
}

// fcallMicros returns Redis' own time per decision over decisions calls of
// the decide function (INFO commandstats: the FCALLs' time, the batch
// function's calls making several).
func fcallMicros(port, decisions int) (float64, bool) {
	out, err := redistest.CLI(port, "info", "commandstats")
	if err != nil || decisions <= 0 {
		return 0, false
	}
	for _, l := range strings.Split(out, "\n") {
		_, stat, ok := strings.Cut(strings.TrimSpace(l), "cmdstat_fcall:")
		if !ok {
			continue
		}
		for _, f := range strings.Split(stat, ",") {
			if v, ok := strings.CutPrefix(f, "usec="); ok {
				us, err := strconv.ParseFloat(v, 64)
				return us / float64(decisions), err == nil
			}
		}
	}
	return 0, false
}

// mustFcallMicros is fcallMicros, failing the test when INFO has no FCALL.
func mustFcallMicros(t *testing.T, port, decisions int) float64 {
	t.Helper()
	us, ok := fcallMicros(port, decisions)
	if !ok {
		t.Fatal("no FCALL in INFO commandstats")
	}
	return us
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

// benchDomains returns one item of the load benchmark's policy
// (scripts/bench-redis.sh: one tier of 1000 per second, active unbounded,
// no hard or global limit) for each of domains domains, and decides each
// once on s, so that every state is present.
func benchDomains(t *testing.T, s *Store, domains int) []store.Item {
	t.Helper()
	p := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 1000, Window: time.Second, Active: tiers.Unbounded}}}
	items := make([]store.Item, domains)
	for i := range items {
		items[i] = store.Item{Key: store.Key{Resource: "bench/key=value", Domain: fmt.Sprint("user", i), PolicyID: 1}, Policy: p, Hits: 1, Min: 1}
	}
	out := make([]tiers.Decision, 1)
	for i := range items {
		if err := s.Decide(context.Background(), time.Time{}, items[i:i+1], out); err != nil || !out[0].OK {
			t.Fatalf("domain %d: %v %+v", i, err, out[0])
		}
	}
	return items
}

// decideRandom sends calls decisions of one random item of items each, on
// the Redis clock, from workers callers in parallel (as under load, so that
// Redis is kept busy), drawing the items from seeds of round. Every one
// must be granted.
func decideRandom(t *testing.T, s *Store, items []store.Item, round, calls, workers int) {
	t.Helper()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(round), uint64(w)))
			out := make([]tiers.Decision, 1)
			for range calls / workers {
				i := r.IntN(len(items))
				if err := s.Decide(context.Background(), time.Time{}, items[i:i+1], out); err != nil || !out[0].OK {
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
}

// BenchmarkScriptCost decides one item per call on 500 keys, one call at a
// time, and reports Redis's own time per decide call (INFO commandstats) as
// redis-µs/op beside the round trip's ns/op.
func BenchmarkScriptCost(b *testing.B) {
	n := redistest.Single(b)
	s := testStore(b, redistest.Client(b, n), Options{})
	if err := s.Load(context.Background()); err != nil {
		b.Fatal(err)
	}
	p := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 100, Window: time.Second, Active: tiers.Unbounded}}}
	items := make([]store.Item, 500)
	for i := range items {
		items[i] = store.Item{Key: store.Key{Resource: "cost", Domain: fmt.Sprint("u", i), PolicyID: 1}, Policy: p, Hits: 1, Min: 1}
	}
	if _, err := redistest.CLI(n.Port, "config", "resetstat"); err != nil {
		b.Fatal(err)
	}
	out := make([]tiers.Decision, 1)
	b.ReportAllocs()
	b.ResetTimer()
	calls := 0
	for ; b.Loop(); calls++ {
		i := calls % len(items)
		if err := s.Decide(context.Background(), time.Time{}, items[i:i+1], out); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	us, ok := fcallMicros(n.Port, calls)
	if !ok {
		b.Fatal("no FCALL in INFO commandstats")
	}
	b.ReportMetric(us, "redis-µs/op")
}

// TestScriptCostBench logs Redis's own time per decision (INFO commandstats)
// for the load benchmark's policy, one item per call, the Redis clock, over
// 10,000 domains whose states are present: every domain is hit once first,
// then 8 callers in parallel send 40,000 calls to random domains. It logs
// the best of CHARON_COST_ROUNDS rounds (e.g. 5), the machine being noisy.
func TestScriptCostBench(t *testing.T) {
	rounds := costRounds(t, "a measurement of 10+ s: set CHARON_COST_ROUNDS (e.g. 5) to run it")
	n, c := singleClient(t)
	s := testStore(t, c, Options{})
	if err := s.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	items := benchDomains(t, s, 10000)
	best := 0.0
	for round := range rounds {
		if _, err := redistest.CLI(n.Port, "config", "resetstat"); err != nil {
			t.Fatal(err)
		}
		decideRandom(t, s, items, round, 40000, 8)
		us := mustFcallMicros(t, n.Port, 40000)
		t.Logf("round: %.2f µs per decision", us)
		if best == 0 || us < best {
			best = us
		}
	}
	t.Logf("Redis time per decision, 1000/s policy, 10,000 domains: best %.2f µs", best)
}

// TestOneTierCost measures what the one-tier path saves Redis on
// TestScriptCostBench's workload: the store (pipelined) deciding one item
// per call of the bench policy on the Redis clock, 10,000 domains whose
// states are present, 8 callers in parallel. The library is loaded a
// second time with the path cut off, and the two take turns, ABBA, for
// CHARON_COST_ROUNDS rounds of 20,000 calls each, so that the machine's
// drift weighs on both alike. It logs, per round and as medians, Redis'
// time per decision (INFO commandstats) and Redis' CPU per call (INFO cpu, the
// whole server).
func TestOneTierCost(t *testing.T) {
	rounds := costRounds(t, "a measurement of 30+ s: set CHARON_COST_ROUNDS (e.g. 16) to run it")
	n, c := singleClient(t)
	// The store calls the functions funcNameArg and batchNameArg name: the
	// rounds switch them while no call is in flight.
	ref := loadWithout(t, c, oneTierCut)
	fns := []any{funcNameArg, ref}
	batches := []any{batchNameArg, strings.Replace(ref, "charon_decide_", "charon_batch_", 1)}
	t.Cleanup(func() { funcNameArg, batchNameArg = fns[0], batches[0] })
	names := []string{"one-tier path", "general path"}

	s := testStore(t, c, Options{})
	const calls = 20000
	items := benchDomains(t, s, 10000)
	var perCall, cpu [2][]float64
	for round := range rounds {
		for k := range 2 {
			v := k
			if round%2 == 1 {
				v = 1 - k
			}
			funcNameArg, batchNameArg = fns[v], batches[v]
			if _, err := redistest.CLI(n.Port, "config", "resetstat"); err != nil {
				t.Fatal(err)
			}
			cpu0 := redisCPU(t, n.Port)
			decideRandom(t, s, items, round, calls, 8)
			us := mustFcallMicros(t, n.Port, calls)
			perCPU := (redisCPU(t, n.Port) - cpu0) * 1e6 / calls
			perCall[v], cpu[v] = append(perCall[v], us), append(cpu[v], perCPU)
			t.Logf("round %d, %s: %.2f µs per decision, %.2f µs of Redis CPU per call", round, names[v], us, perCPU)
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
	saving("Redis time per decision", perCall)
	saving("Redis CPU per call", cpu)
}

// TestManyCost measures what the many path saves Redis on a call of three
// one-tier items on distinct keys ({user}, {tenant}, {api, user} of Envoy
// descriptors), all granted: the library with and without the path take
// turns, ABBA, for CHARON_COST_ROUNDS rounds of 2,000 calls over 10,000
// users, and Redis' own time per FCALL (INFO commandstats) is logged for
// each.
func TestManyCost(t *testing.T) {
	rounds := costRounds(t, "set CHARON_COST_ROUNDS to measure")
	n, c := singleClient(t)
	ctx := context.Background()
	fns := []string{funcName, loadWithout(t, c, manyCut)}
	one := func(limit int64) any {
		return encodePolicy(&tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: limit, Window: time.Second, Active: tiers.Unbounded}}}, time.Time{}).arg
	}
	pols := []any{one(1000), one(10000), one(100)}
	h := f64s(nil, modeDecide, -1, 3_600_000, 1000, 3, 3)
	for i := range int64(3) {
		h = f64s(h, i+1, 0, i+1, 1, 1, 0)
	}
	r := rand.New(rand.NewPCG(1, 2))
	var sums [2]float64
	for round := range rounds {
		for _, k := range [][]int{{0, 1}, {1, 0}}[round%2] {
			if err := c.ConfigResetStat(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			for range 2000 {
				u := r.IntN(10000)
				args := []any{"fcall", fns[k], 3, fmt.Sprintf("m%d:u%d", k, u), fmt.Sprintf("m%d:t%d", k, u/100),
					fmt.Sprintf("m%d:a%d:u%d", k, r.IntN(10), u), string(h), ""}
				if err := c.Do(ctx, append(args, pols...)...).Err(); err != nil {
					t.Fatal(err)
				}
			}
			sums[k] += mustFcallMicros(t, n.Port, 2000)
		}
	}
	t.Logf("Redis µs per FCALL of three items over %d rounds: with the many path %.1f, without %.1f (%.0f%% less)",
		rounds, sums[0]/float64(rounds), sums[1]/float64(rounds), 100*(1-sums[0]/sums[1]))
}
