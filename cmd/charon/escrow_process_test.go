package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/charonlimit/charon/internal/redistest"
)

// The limits of the escrow process test: tenant, 1000 per 2s (leases of
// 100ms); burst, 100 per 2s. Above 64 hits a window is counted in 64
// buckets, and the limit holds over the window less one bucket (package
// tiers): effectiveWindow.
const (
	tenantLimit = 1000
	burstLimit  = 100
	escrowW     = 2 * time.Second
)

// effectiveWindow is the window a limit above 64 is enforced over.
var effectiveWindow = escrowW - escrowW/64 + time.Microsecond

// grant is a granted answer: the decision was made between sent and got.
type grant struct{ sent, got time.Time }

// TestEscrowProcesses runs three `charon serve --store redis` replicas on
// one Redis, with --escrow and without (the baseline), in three phases:
//
//   - a hot key far under its limit, asked as fast as four clients per
//     replica can: the Redis calls per decision;
//   - tenant, 1000 per 2s, asked 450 times a second (90% of its limit),
//     spread evenly: every request is within the limit, so a rejection is
//     a false one;
//   - burst, 100 per 2s, asked 500 times a second (10x), one replica
//     killed (SIGKILL) halfway.
//
// From the clients' answers no window of the last two phases holds more
// grants than its limit, and no request fails but the killed replica's.
// With escrow, charon usage and charon explain show the hot key's leases
// on a replica while it is hot, and the decision logs mark some decisions
// "escrow": "local"; without, neither. The figures (calls per decision,
// false rejections) are logged, not asserted.
func TestEscrowProcesses(t *testing.T) {
	bin := buildCharon(t)
	dir := t.TempDir()
	yaml := fmt.Sprintf(`domain: test
descriptors:
  - key: tenant
    tiers: [{limit: %d, window: %s}]
  - key: burst
    tiers: [{limit: %d, window: %s}]
  - key: hot
    rate_limit: {unit: minute, requests_per_unit: 100000000}
`, tenantLimit, escrowW, burstLimit, escrowW)
	if err := os.WriteFile(filepath.Join(dir, "test.yaml"), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	phase := escrowPhase(t, 3*escrowW)
	for _, mode := range []string{"escrow", "shared"} {
		t.Run(mode, func(t *testing.T) {
			r := redistest.Single(t)
			args := []string{"--config", dir, "--store", "redis", "--redis-url", "redis://" + r.Addr(), "--redis-timeout", "2s"}
			if mode == "escrow" {
				args = append(args, "--escrow", "--escrow-threshold", "5", "--escrow-rebalance", "500ms")
			}
			var procs []*proc
			var logs []string
			for i := range 3 {
				logs = append(logs, filepath.Join(t.TempDir(), fmt.Sprintf("decisions-%d.jsonl", i)))
				procs = append(procs, startServe(t, bin, append(slices.Clone(args), "--decision-log", logs[i])...))
			}
			calls := func(f func() loadRun) (loadRun, map[string]int64) {
				before := commandStats(t, r.Port)
				res := f()
				after := commandStats(t, r.Port)
				for k := range after {
					after[k] -= before[k]
				}
				return res, after
			}
			var usage string
			hot, hotCalls := calls(func() loadRun {
				done := make(chan loadRun, 1)
				go func() { done <- closedLoop(procs, "hot", phase) }()
				usage = hotUsage(t, procs[0], mode == "escrow", time.Now().Add(phase))
				return <-done
			})
			if usage != "" {
				t.Errorf("%s: %s", mode, usage)
			}
			near, nearCalls := calls(func() loadRun { return paced(procs, "tenant", tenantLimit*9/10/int(escrowW/time.Second), phase, -1) })
			over, overCalls := calls(func() loadRun { return paced(procs, "burst", 10*burstLimit/int(escrowW/time.Second), phase, phase/2) })
			for _, x := range []struct {
				name string
				r    loadRun
				c    map[string]int64
			}{{"hot key under its limit", hot, hotCalls}, {"90% of the limit", near, nearCalls}, {"10x the limit, a replica killed", over, overCalls}} {
				t.Logf("%s, %s: %d answered (%.0f/s), %d granted, %d rejected; Redis per decision: %.4f FCALL, %.4f EXEC (fair shares), %.4f commands with the scripts' own",
					mode, x.name, x.r.answered, float64(x.r.answered)/phase.Seconds(), len(x.r.grants), x.r.answered-len(x.r.grants),
					per(x.c["fcall"], x.r.answered), per(x.c["exec"], x.r.answered), per(sum(x.c), x.r.answered))
				if x.r.errs > 0 {
					t.Errorf("%s, %s: %d requests failed", mode, x.name, x.r.errs)
				}
			}
			// The decision logs say which decisions were made from leases:
			// some of the hot key's with escrow, none without.
			local := 0
			for _, l := range logs {
				b, err := os.ReadFile(l)
				if err != nil {
					t.Fatal(err)
				}
				local += strings.Count(string(b), `"escrow":"local"`)
			}
			if (mode == "escrow") != (local > 0) {
				t.Errorf("%s: %d decision log lines say \"escrow\":\"local\"", mode, local)
			}
			if o := overLimit(near.grants, effectiveWindow, tenantLimit); o != "" {
				t.Errorf("%s, tenant: %s", mode, o)
			}
			if o := overLimit(over.grants, effectiveWindow, burstLimit); o != "" {
				t.Errorf("%s, burst: %s", mode, o)
			}
		})
	}
}

// escrowPhase is the length of a phase of the escrow process tests: def,
// or CHARON_ESCROW_PHASE (a duration) for the longer runs of
// docs/performance.md.
func escrowPhase(t *testing.T, def time.Duration) time.Duration {
	v := os.Getenv("CHARON_ESCROW_PHASE")
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < escrowW {
		t.Fatalf("CHARON_ESCROW_PHASE=%q: want a duration of at least %v", v, escrowW)
	}
	return d
}

// hotUsage asks p for hot=acme's usage and explanation (charon usage and
// charon explain, in this process) until, with escrow, they show what p's
// leases hold, or until deadline; it returns what went wrong, or "".
// Without escrow, usage must show no lease.
func hotUsage(t *testing.T, p *proc, escrow bool, deadline time.Time) string {
	t.Helper()
	for {
		var usage, explain, errb strings.Builder
		args := []string{"--addr", p.grpcAddr, "--domain", "test", "--descriptor", "hot=acme"}
		run(append([]string{"usage"}, args...), os.Getenv, &usage, &errb)
		run(append([]string{"explain"}, args...), os.Getenv, &explain, &errb)
		lines := strings.Split(strings.TrimSpace(usage.String()), "\n")
		row := lines[len(lines)-1]
		if !escrow {
			if !strings.HasSuffix(row, " -") || strings.Contains(explain.String(), "in escrow") {
				return fmt.Sprintf("without escrow, charon usage shows %q, charon explain:\n%s", row, explain.String())
			}
			return ""
		}
		if strings.Contains(row, " held in ") && strings.Contains(explain.String(), "  escrow    in escrow on this replica: ") {
			return ""
		}
		if time.Now().After(deadline) {
			return fmt.Sprintf("charon usage and explain never showed a lease of the hot key: %q (%s), explain:\n%s", row, errb.String(), explain.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// loadRun is what a load saw: the grants, the answers, and the requests that
// failed (but those sent to a killed replica).
type loadRun struct {
	grants         []grant
	answered, errs int
}

func per(n int64, d int) float64 { return float64(n) / float64(max(d, 1)) }

func sum(m map[string]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

// answers gathers a load's answers.
type answers struct {
	mu sync.Mutex
	r  loadRun
}

// askTimeout is the deadline of each request, wide: a request that misses
// it counts as failed, and a machine shared with other builds can stall a
// process for seconds. It also bounds the wait for Redis: a server waits
// until a quarter of the time left before the caller's deadline (at 2s,
// 1.5s; --redis-timeout applies only to a caller that sends none), then
// the failure mode decides, and the default one, local, decides on each
// replica alone, which may grant past the shared limit by design. The test
// is about the shared state.
const askTimeout = 30 * time.Second

// ask sends one request for key=acme to p and records its answer; a
// failure is not counted once killed is set (p is the replica killed).
func (rec *answers) ask(p *proc, key string, killed *atomic.Bool) {
	ctx, cancel := context.WithTimeout(context.Background(), askTimeout)
	defer cancel()
	sent := time.Now()
	resp, err := p.ask(ctx, key, "acme")
	got := time.Now()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	switch {
	case err != nil:
		if killed == nil || !killed.Load() {
			rec.r.errs++
		}
	case resp.OverallCode == rlsv3.RateLimitResponse_OK:
		rec.r.answered++
		rec.r.grants = append(rec.r.grants, grant{sent, got})
	default:
		rec.r.answered++
	}
}

// closedLoop asks for key through procs from four clients each for d.
func closedLoop(procs []*proc, key string, d time.Duration) loadRun {
	var rec answers
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for _, p := range procs {
		for range 4 {
			wg.Go(func() {
				for time.Now().Before(end) {
					rec.ask(p, key, nil)
				}
			})
		}
	}
	wg.Wait()
	return rec.r
}

// paced asks for key rate times a second for d, round robin over procs,
// and kills the last proc (SIGKILL) after kill (never when negative). Only
// the requests sent to the killed proc may fail: the others' failures
// count, before the kill and after it.
func paced(procs []*proc, key string, rate int, d, kill time.Duration) loadRun {
	var rec answers
	var dead atomic.Bool
	victim := procs[len(procs)-1]
	live := procs
	start := time.Now()
	var wg sync.WaitGroup
	for i := 0; ; i++ {
		at := start.Add(time.Duration(i) * time.Second / time.Duration(rate))
		if at.Sub(start) >= d {
			break
		}
		time.Sleep(time.Until(at))
		if kill >= 0 && !dead.Load() && time.Since(start) >= kill {
			dead.Store(true)
			victim.cmd.Process.Signal(syscall.SIGKILL)
			live = procs[:len(procs)-1]
		}
		p := live[i%len(live)]
		var killed *atomic.Bool
		if p == victim {
			killed = &dead
		}
		wg.Go(func() { rec.ask(p, key, killed) })
	}
	wg.Wait()
	return rec.r
}

// overLimit returns a description of a window of w holding more than limit
// grants, or "": for each grant, the grants whose decisions certainly fell
// in the window starting when it was sent (sent at or after it, answered
// before the window's end) are counted.
func overLimit(grants []grant, w time.Duration, limit int) string {
	slices.SortFunc(grants, func(a, b grant) int { return a.sent.Compare(b.sent) })
	for i, g := range grants {
		n := 0
		for _, h := range grants[i:] {
			if h.sent.Sub(g.sent) >= w {
				break
			}
			if h.got.Sub(g.sent) < w {
				n++
			}
		}
		if n > limit {
			return fmt.Sprintf("%d grants decided within %v from %v, limit %d", n, w, g.sent.Format(time.StampMicro), limit)
		}
	}
	return ""
}

// commandStats returns the calls of each command Redis has loadRun
// (INFO commandstats), by name.
func commandStats(t *testing.T, port int) map[string]int64 {
	t.Helper()
	out, err := redistest.CLI(port, "info", "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]int64{}
	for _, line := range strings.Split(out, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.SplitN(rest, ",", 2)[0], 10, 64)
		m[strings.TrimPrefix(name, "cmdstat_")] = n
	}
	return m
}

// TestEscrowRegionsProcesses runs two regions, each a `charon serve`
// replica on its own Redis, leasing from one home Redis behind a link of
// about 80ms (a proxy holding each chunk 40ms each way), with --escrow
// and --failure-mode closed:
//
//   - a hot key far under its limit, asked as fast as four clients per
//     replica can: the home's calls per decision, and how long answers
//     took (logged);
//   - tenant, 1000 per 2s, asked 450 times a second (90%) over both
//     regions for 3 windows: the false rejections (logged);
//   - burst, 100 per 2s, asked 500 times a second (10x) over both regions
//     for 4 windows, region two's link cut (a black hole) for the middle
//     two.
//
// CHARON_ESCROW_PHASE lengthens every phase, CHARON_ESCROW_REGIONS adds
// regions (docs/performance.md's runs).
//
// From the clients' answers no window of the second phase holds more
// grants than its limit, whichever region granted them, and no request
// fails: a region cut off decides from its slices until they end, then as
// the failure mode says.
func TestEscrowRegionsProcesses(t *testing.T) {
	bin := buildCharon(t)
	dir := t.TempDir()
	yaml := fmt.Sprintf(`domain: test
descriptors:
  - key: tenant
    tiers: [{limit: %d, window: %s}]
  - key: burst
    tiers: [{limit: %d, window: %s}]
  - key: hot
    rate_limit: {unit: minute, requests_per_unit: 100000000}
`, tenantLimit, escrowW, burstLimit, escrowW)
	if err := os.WriteFile(filepath.Join(dir, "test.yaml"), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	home := redistest.Single(t)
	var procs []*proc
	var links []*faultProxy
	regions := 2
	if v := os.Getenv("CHARON_ESCROW_REGIONS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 2 {
			t.Fatalf("CHARON_ESCROW_REGIONS=%q: want a number of regions from 2", v)
		}
		regions = n
	}
	for i := range regions {
		region := redistest.Single(t)
		link := newFaultProxy(t, home.Addr(), 40*time.Millisecond)
		link.mode.Store(proxySlow)
		links = append(links, link)
		procs = append(procs, startServe(t, bin, "--config", dir, "--store", "redis", "--redis-url", "redis://"+region.Addr(),
			"--escrow-home", "redis://"+link.addr, "--escrow-region", fmt.Sprintf("r%d", i+1), "--redis-timeout", "2s",
			"--failure-mode", "closed", "--escrow", "--escrow-threshold", "5"))
	}
	before := commandStats(t, home.Port)
	hot := closedLoop(procs, "hot", escrowPhase(t, 3*escrowW))
	after := commandStats(t, home.Port)
	for k := range after {
		after[k] -= before[k]
	}
	took := make([]time.Duration, 0, len(hot.grants))
	for _, g := range hot.grants {
		took = append(took, g.got.Sub(g.sent))
	}
	slices.Sort(took)
	quantile := func(q float64) time.Duration {
		if len(took) == 0 {
			return 0
		}
		return took[int(q*float64(len(took)-1))]
	}
	t.Logf("hot key, %d regions 80ms from the home: %d answered (%.0f/s), answers in %v (p50) %v (p99) %v (p99.9); the home's calls per decision: %.4f FCALL, %.4f commands",
		regions, hot.answered, float64(hot.answered)/escrowPhase(t, 3*escrowW).Seconds(), quantile(0.5), quantile(0.99), quantile(0.999),
		per(after["fcall"], hot.answered), per(sum(after), hot.answered))
	if hot.errs > 0 {
		t.Errorf("hot key: %d requests failed", hot.errs)
	}
	near := paced(procs, "tenant", tenantLimit*9/10/int(escrowW/time.Second), escrowPhase(t, 3*escrowW), -1)
	t.Logf("tenant at 90%% of its limit over the regions: %d answered, %d granted, %d rejected (every rejection a false one)",
		near.answered, len(near.grants), near.answered-len(near.grants))
	if near.errs > 0 {
		t.Errorf("tenant: %d requests failed", near.errs)
	}
	if o := overLimit(near.grants, effectiveWindow, tenantLimit); o != "" {
		t.Errorf("tenant: %s", o)
	}
	phase := escrowPhase(t, 4*escrowW)
	cut := make(chan struct{})
	go func() {
		defer close(cut)
		time.Sleep(phase / 4)
		links[1].mode.Store(proxyHole)
		time.Sleep(phase / 2)
		links[1].mode.Store(proxySlow)
	}()
	over := paced(procs, "burst", 10*burstLimit/int(escrowW/time.Second), phase, -1)
	<-cut
	t.Logf("burst at 10x, region two cut off for half the phase: %d answered, %d granted (limit %d per %v)",
		over.answered, len(over.grants), burstLimit, escrowW)
	if over.errs > 0 {
		t.Errorf("burst: %d requests failed", over.errs)
	}
	if o := overLimit(over.grants, effectiveWindow, burstLimit); o != "" {
		t.Errorf("burst: %s", o)
	}
	if len(over.grants) == 0 {
		t.Error("burst: nothing was granted")
	}
}
