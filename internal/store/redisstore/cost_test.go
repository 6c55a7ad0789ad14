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

	"github.com/redis/go-redis/v9"

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

// A fastPathCost is a measurement of a fast path: the line that opens it
// (paths_test.go), and its workload: one FCALL of the calls the path takes
// (args, of the function fn on keys of prefix, for a domain). A prepare
// leaves its lock, which the next prepare of the same token takes as its
// own.
type fastPathCost struct {
	name string
	cut  string
	args func(fn, prefix string, domain int) []any
}

// fastPathCosts are the workloads of TestFastPathCost, granted calls on
// the policies of scripts/bench-redis.sh (1000 hits per second per domain:
// one tier active unbounded, or with --fixed-window a fixed window), over
// states present.
func fastPathCosts() []fastPathCost {
	pol := func(p *tiers.Policy) any { return encodePolicy(p, time.Time{}).arg }
	oneTier := pol(&tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 1000, Window: time.Second, Active: tiers.Unbounded}}})
	// The same tier with a hard limit: neither the one-tier nor the
	// fixed-window path takes it.
	hard := pol(&tiers.Policy{Kind: tiers.KindTiers, HardLimit: 100_000, Tiers: []tiers.Tier{{Limit: 1000, Window: time.Second, Active: tiers.Unbounded}}})
	fixed := pol(&tiers.Policy{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Limit: 1000, Unit: tiers.UnitSecond}})
	oneItem := string(one(modeDecide, -1, 3_600_000, 1000, 0, 1, 1, 0))
	prepare := string(one(modePrepare, -1, 3_600_000, 1000, 0, 1, 1, 0))
	h3 := header{mode: modeDecide, now: -1, maxTTL: 3_600_000, lease: 1000, nk: 3}
	for i := range 3 {
		h3.items = append(h3.items, item1(i+1, 0, i+1, 1, 1, 0))
	}
	three := planned(h3)
	single := func(h string, p any) func(fn, prefix string, d int) []any {
		return func(fn, prefix string, d int) []any {
			return []any{"fcall", fn, 1, fmt.Sprint(prefix, "u", d), h, "", p}
		}
	}
	peek := func(p any) func(fn, prefix string, d int) []any {
		return func(fn, prefix string, d int) []any {
			k := fmt.Sprint(prefix, "u", d)
			return []any{"fcall", fn, 2, k, k + ":lock", prepare, "tok", p}
		}
	}
	// Envoy's three descriptors ({user}, {tenant}, {api, user}).
	many := func(p any) func(fn, prefix string, d int) []any {
		return func(fn, prefix string, d int) []any {
			return []any{"fcall", fn, 3, fmt.Sprint(prefix, "u", d), fmt.Sprint(prefix, "t", d/100),
				fmt.Sprint(prefix, "a", d%10, ":u", d), string(three), "", p, p, p}
		}
	}
	return []fastPathCost{
		{"single (one item, hard limit)", singleCut, single(oneItem, hard)},
		{"one-tier (one item)", oneTierCut, single(oneItem, oneTier)},
		{"fixed (one item)", fixedCut, single(oneItem, fixed)},
		{"peek, one-tier (prepare of one item)", peekCut, peek(oneTier)},
		{"peek, fixed0 (prepare of one item)", peekCut, peek(fixed)},
		{"many, one-tier (three items)", manyCut, many(oneTier)},
		{"many, fixed (three items)", manyCut, many(fixed)},
	}
}

// TestFastPathCost measures what each fast path saves Redis: for each
// workload of fastPathCosts, the library and a copy with the path cut off
// take turns, ABBA, for CHARON_COST_ROUNDS rounds (e.g. 8) of 20,000
// FCALLs to random domains of 10,000 (each domain's states made first),
// sent in pipelines of 50 on the Redis clock. It logs, per path, the
// medians of Redis' CPU per FCALL (INFO cpu, the whole server: what a busy
// machine leaves intact) and of Redis' time per FCALL (INFO commandstats:
// wall time, which a descheduled server inflates), with and without the
// path, and the savings: the medians of the rounds' savings. doc.go keeps
// a fast path only when it saves at least 20% of Redis' time per call.
// CHARON_COST_PATH, when set, picks the workloads whose name contains it.
func TestFastPathCost(t *testing.T) {
	rounds := costRounds(t, "a measurement of minutes: set CHARON_COST_ROUNDS (e.g. 8) to run it")
	only := os.Getenv("CHARON_COST_PATH")
	n, c := singleClient(t)
	ctx := context.Background()
	const domains, calls, batch = 10000, 20000, 50
	send := func(w fastPathCost, fn, prefix string, ds []int) {
		for len(ds) > 0 {
			k := min(batch, len(ds))
			pipe := c.Pipeline()
			for _, d := range ds[:k] {
				pipe.Do(ctx, w.args(fn, prefix, d)...)
			}
			cmds, err := pipe.Exec(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, cmd := range cmds {
				if rd := (&reader{b: cmd.(*redis.Cmd).Val().(string)[16:]}); rd.num()&1 == 0 {
					t.Fatalf("%s: a call was not granted", w.name)
				}
			}
			ds = ds[k:]
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
	for wi, w := range fastPathCosts() {
		if only != "" && !strings.Contains(w.name, only) {
			continue
		}
		fns := []string{funcName, loadWithout(t, c, w.cut)}
		prefix := func(v int) string { return fmt.Sprintf("cost%d:%d:", wi, v) }
		all := make([]int, domains)
		for d := range all {
			all[d] = d
		}
		for v := range 2 {
			send(w, fns[v], prefix(v), all)
		}
		r := rand.New(rand.NewPCG(uint64(wi), 1))
		var us, cpu [2][]float64
		var saved, savedCPU []float64
		for round := range rounds {
			ds := make([]int, calls)
			for i := range ds {
				ds[i] = r.IntN(domains)
			}
			order := []int{0, 1}
			if round%2 == 1 {
				order = []int{1, 0}
			}
			for _, v := range order {
				if err := c.ConfigResetStat(ctx).Err(); err != nil {
					t.Fatal(err)
				}
				cpu0 := redisCPU(t, n.Port)
				send(w, fns[v], prefix(v), ds)
				us[v] = append(us[v], mustFcallMicros(t, n.Port, calls))
				cpu[v] = append(cpu[v], (redisCPU(t, n.Port)-cpu0)*1e6/calls)
			}
			saved = append(saved, 100*(us[1][round]-us[0][round])/us[1][round])
			savedCPU = append(savedCPU, 100*(cpu[1][round]-cpu[0][round])/cpu[1][round])
		}
		t.Logf("%s, medians over %d rounds: Redis CPU µs per FCALL %.2f with the path, %.2f without: saving %.1f%% (rounds %.1f%% to %.1f%%); Redis µs per FCALL (INFO commandstats) %.2f, %.2f: saving %.1f%% (rounds %.1f%% to %.1f%%)",
			w.name, rounds, med(cpu[0]), med(cpu[1]), med(savedCPU), slices.Min(savedCPU), slices.Max(savedCPU),
			med(us[0]), med(us[1]), med(saved), slices.Min(saved), slices.Max(saved))
	}
}
