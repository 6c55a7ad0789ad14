package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/charonlimit/charon/internal/redistest"
	"github.com/charonlimit/charon/internal/servertest"
)

// proc is a running `charon serve`.
type proc struct {
	grpcAddr, httpAddr, debugAddr string
	cmd                           *exec.Cmd
	stderr                        *servertest.Buffer
	exited                        chan error
	rls                           rlsv3.RateLimitServiceClient
	health                        healthpb.HealthClient
}

// startServe starts `charon serve` on free ports with args and waits until
// /healthcheck answers 200.
func startServe(t *testing.T, bin string, args ...string) *proc {
	t.Helper()
	return startServeEnv(t, bin, nil, args...)
}

// startServeEnv is startServe with extra environment variables.
func startServeEnv(t *testing.T, bin string, env []string, args ...string) *proc {
	t.Helper()
	addrs := freeAddrs(t, 3)
	p := &proc{
		grpcAddr:  addrs[0],
		httpAddr:  addrs[1],
		debugAddr: addrs[2],
		stderr:    &servertest.Buffer{},
		exited:    make(chan error, 1),
	}
	// No drain on SIGTERM unless args ask for one.
	args = append([]string{"serve", "--grpc-addr", p.grpcAddr, "--http-addr", p.httpAddr, "--debug-addr", p.debugAddr, "--shutdown-delay=0s"}, args...)
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(append(os.Environ(), "LOG_FORMAT=text"), env...)
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			p.cmd.Process.Kill()
			<-p.exited
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get("http://" + p.httpAddr + "/healthcheck")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		select {
		case err := <-p.exited:
			t.Fatalf("charon serve exited early: %v\n%s", err, p.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("not healthy in time\n%s", p.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	cc, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	p.rls = rlsv3.NewRateLimitServiceClient(cc)
	p.health = healthpb.NewHealthClient(cc)
	return p
}

// stop sends SIGTERM and demands a clean exit.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.exited:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v\n%s", err, p.stderr.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("no exit 15 s after SIGTERM\n%s", p.stderr.String())
	}
}

// alive fails the test when the process has exited.
func (p *proc) alive(t *testing.T) {
	t.Helper()
	select {
	case err := <-p.exited:
		p.exited <- err
		t.Fatalf("charon serve exited: %v\n%s", err, p.stderr.String())
	default:
	}
}

// ask sends one ShouldRateLimit of domain test, descriptor key=value.
func (p *proc) ask(ctx context.Context, key, value string) (*rlsv3.RateLimitResponse, error) {
	return p.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
		Domain: "test",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: key, Value: value}},
		}},
	})
}

func (p *proc) mustOK(t *testing.T, key, value string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := p.ask(ctx, key, value)
	if err != nil {
		t.Fatalf("ShouldRateLimit %s=%s: %v\n%s", key, value, err, p.stderr.String())
	}
	return resp.OverallCode == rlsv3.RateLimitResponse_OK
}

// testLimit is the limit of descriptor "user" in writeRedisConfig.
const testLimit = 20

// writeRedisConfig writes a configuration directory: user is limited to
// testLimit per hour; tiered has a 5-per-hour tier and a burst tier of 10
// per hour that stays active for an hour (15 hits in all, then rejected);
// load is practically unlimited.
func writeRedisConfig(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	yaml := fmt.Sprintf(`domain: test
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: %d}
  - key: tiered
    tiers:
      - {limit: 5, window: 1h}
      - {limit: 10, window: 1h, active: 1h}
  - key: load
    rate_limit: {unit: hour, requests_per_unit: 1000000}
  - key: burst
    rate_limit: {unit: hour, requests_per_unit: 50}
`, testLimit)
	if err := os.WriteFile(filepath.Join(dir, "test.yaml"), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// burst sends n concurrent requests for key=value, alternating between
// procs, and returns how many were OK.
func burst(t *testing.T, procs []*proc, n int, key, value string) int {
	t.Helper()
	return burstWithin(t, procs, n, 10*time.Second, key, value)
}

// burstWithin is burst with each request's deadline.
func burstWithin(t *testing.T, procs []*proc, n int, deadline time.Duration, key, value string) int {
	t.Helper()
	var ok, failed atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		p := procs[i%len(procs)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			resp, err := p.ask(ctx, key, value)
			switch {
			case err != nil:
				failed.Add(1)
				t.Errorf("ShouldRateLimit: %v", err)
			case resp.OverallCode == rlsv3.RateLimitResponse_OK:
				ok.Add(1)
			}
		}()
	}
	close(start)
	wg.Wait()
	return int(ok.Load())
}

// TestRedisProcessesShareLimits runs two `charon serve --store redis`
// processes on one Redis: a burst of 10×L concurrent requests split across
// them grants exactly L, and a burst through one process is seen by the
// other.
func TestRedisProcessesShareLimits(t *testing.T) {
	r := redistest.Single(t)
	bin := buildCharon(t)
	cfg := writeRedisConfig(t)
	url := "redis://" + r.Addr()
	// The default 10 ms store timeout is for production; on a loaded test
	// machine a cold burst would time out into the local failure mode, which
	// is per process by design. This test is about the shared state.
	a := startServe(t, bin, "--config", cfg, "--store", "redis", "--redis-url", url, "--redis-timeout", "2s")
	b := startServe(t, bin, "--config", cfg, "--store", "redis", "--redis-url", url, "--redis-timeout", "2s")
	procs := []*proc{a, b}

	if got := burst(t, procs, 10*testLimit, "user", "alice"); got != testLimit {
		t.Errorf("burst of %d over two processes: %d granted, want exactly %d", 10*testLimit, got, testLimit)
	}
	// The limit is spent for both.
	for _, p := range procs {
		if p.mustOK(t, "user", "alice") {
			t.Errorf("a process grants alice after the shared limit was spent")
		}
	}

	// Tier state: 15 hits through a fill tier 1 and burst into tier 2; b
	// sees bob in tier 2, full.
	granted := 0
	for i := 0; i < 15; i++ {
		if a.mustOK(t, "tiered", "bob") {
			granted++
		}
	}
	if granted != 15 {
		t.Errorf("15 hits through one process: %d granted, want 15 (5 in tier 1, 10 in tier 2)", granted)
	}
	if b.mustOK(t, "tiered", "bob") {
		t.Errorf("the other process grants bob after his burst tier was spent through the first")
	}
	// A fresh domain on b is granted: the rejection is bob's.
	if !b.mustOK(t, "tiered", "carol") {
		t.Errorf("carol rejected")
	}
	// Explain through b reads bob's state from Redis: tier 2, full.
	var out, errb strings.Builder
	if code := run([]string{"explain", "--addr", b.grpcAddr, "--domain", "test", "--descriptor", "tiered=bob", "--json"}, os.Getenv, &out, &errb); code != 0 ||
		!strings.Contains(out.String(), `tier 2 of 2 (10 per 1h0m0s), 10 hits in its window: rejecting for`) {
		t.Errorf("charon explain through the other process: exit %d\n%s%s", code, out.String(), errb.String())
	}

	metrics := get(t, "http://"+a.debugAddr+"/metrics")
	for _, want := range []string{`charon_store_calls_total{path="remote"}`, `charon_store_breaker_state 0`,
		"charon_store_overlimit_cache_hits_total", `charon_redis_late_grants_total{outcome="given_back"} 0`,
		`charon_redis_slot_undos_total{outcome="undo_failed"} 0`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	a.stop(t)
	b.stop(t)
}

// latencyOver50ms reads charon_request_duration_seconds from p's /metrics:
// the RPCs observed and those over 50 ms.
func latencyOver50ms(t *testing.T, p *proc) (total, over int64) {
	t.Helper()
	var le50 int64 = -1
	for _, line := range strings.Split(get(t, "http://"+p.debugAddr+"/metrics"), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		switch f[0] {
		case `charon_request_duration_seconds_bucket{le="0.05"}`:
			le50, _ = strconv.ParseInt(f[1], 10, 64)
		case "charon_request_duration_seconds_count":
			total, _ = strconv.ParseInt(f[1], 10, 64)
		}
	}
	if le50 < 0 || total == 0 {
		t.Fatalf("no request duration histogram in /metrics")
	}
	return total, total - le50
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	buf.ReadFrom(resp.Body)
	return buf.String()
}

// TestRedisBurstExactAtDefaults: at default settings, a burst of 400
// concurrent single-hit requests over three servers sharing Redis, each caller
// allowing 3 s, grants exactly the limit (50): decisions wait for Redis as
// long as the callers allow instead of falling back to per-process state.
// No decision left the remote path, and other keys keep their whole limit.
func TestRedisBurstExactAtDefaults(t *testing.T) {
	r := redistest.Single(t)
	bin := buildCharon(t)
	cfg := writeRedisConfig(t)
	url := "redis://" + r.Addr()
	a := startServe(t, bin, "--config", cfg, "--store", "redis", "--redis-url", url)
	b := startServe(t, bin, "--config", cfg, "--store", "redis", "--redis-url", url)
	c := startServe(t, bin, "--config", cfg, "--store", "redis", "--redis-url", url)
	procs := []*proc{a, b, c}
	for round, who := range []string{"k1", "k2"} {
		if got := burstWithin(t, procs, 400, 3*time.Second, "burst", who); got != 50 {
			t.Errorf("round %d: burst of 400 over three servers: %d granted, want exactly 50", round, got)
		}
	}
	granted := 0
	for i := 0; i < testLimit+5; i++ {
		if procs[i%len(procs)].mustOK(t, "user", "untouched") {
			granted++
		}
	}
	if granted != testLimit {
		t.Errorf("another key after the bursts: %d of %d granted, want its limit %d", granted, testLimit+5, testLimit)
	}
	for _, p := range procs {
		m := get(t, "http://"+p.debugAddr+"/metrics")
		for _, path := range []string{"local", "unavailable", "open", "closed"} {
			if n := metricValue(m, `charon_store_calls_total{path="`+path+`"}`); n != 0 {
				t.Errorf("%s: %v decisions on path %s, want 0 (Redis was up)", p.grpcAddr, n, path)
			}
		}
		t.Logf("%s: remote %v, slow timeouts %v, not sent %v", p.grpcAddr,
			metricValue(m, `charon_store_calls_total{path="remote"}`),
			metricValue(m, "charon_store_remote_slow_total"), metricValue(m, "charon_store_not_sent_total"))
	}
}

// metricValue is the value of the sample named name (with its labels, as
// exposed) in a Prometheus text exposition, or -1 when absent.
func metricValue(exposition, name string) float64 {
	for _, line := range strings.Split(exposition, "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err == nil {
				return v
			}
		}
	}
	return -1
}

// eventually polls cond until it holds, and fails the test when it does not
// within 30 s (slack for a machine many times slower than an idle one).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(30 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("not within 30 s: %s", what)
		}
	}
}

// TestRedisKilledUnderLoad kills Redis under load: every RPC is answered
// before the caller's deadline as the failure mode says (the server bounds a
// Redis decision by --redis-timeout, 10 ms; callers allow 5 s), the process
// survives, and once Redis is back decisions return to it. Latency and
// recovery figures are logged as "reliability:" lines (make reliability);
// they are not asserted, since a busy machine stretches them.
func TestRedisKilledUnderLoad(t *testing.T) {
	bin := buildCharon(t)
	cfg := writeRedisConfig(t)
	for _, mode := range []string{"local", "unavailable"} {
		t.Run(mode, func(t *testing.T) {
			r, rargs := redistest.SingleArgs(t)
			p := startServe(t, bin, "--config", cfg, "--store", "redis", "--redis-url", "redis://"+r.Addr(),
				"--failure-mode", mode)

			var (
				stopLoad       atomic.Bool
				calls, unavail atomic.Int64
				wg             sync.WaitGroup
				mu             sync.Mutex
				latencies      []time.Duration
			)
			for w := 0; w < 8; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var mine []time.Duration
					defer func() {
						mu.Lock()
						latencies = append(latencies, mine...)
						mu.Unlock()
					}()
					for i := 0; !stopLoad.Load(); i++ {
						ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
						start := time.Now()
						_, err := p.ask(ctx, "load", "v"+strconv.Itoa(w*100+i%100))
						mine = append(mine, time.Since(start))
						cancel()
						calls.Add(1)
						switch {
						case err == nil:
						case status.Code(err) == codes.Unavailable && mode == "unavailable":
							unavail.Add(1)
						default:
							t.Errorf("ShouldRateLimit in mode %s: %v", mode, err)
							return
						}
					}
				}()
			}
			defer func() {
				stopLoad.Store(true)
				wg.Wait()
			}()

			eventually(t, "200 calls before Redis is killed", func() bool { return calls.Load() >= 200 })
			r.Kill()
			// The breaker opens on the failures of the calls under load.
			eventually(t, "the breaker opened", func() bool {
				return metricValue(get(t, "http://"+p.debugAddr+"/metrics"), "charon_store_breaker_state") == 1
			})
			p.alive(t)
			if mode == "unavailable" {
				eventually(t, "NOT_SERVING while Redis is down in mode unavailable", func() bool {
					h, err := p.health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
					return err == nil && h.Status == healthpb.HealthCheckResponse_NOT_SERVING
				})
				eventually(t, "an UNAVAILABLE answer while Redis is down", func() bool { return unavail.Load() > 0 })
			}
			r.Restart(t, rargs...)
			back := time.Now()
			// Redis restarted empty: decisions are back on it when state
			// keys appear. The probe pings every 100 ms; 30 s is slack for
			// a machine many times slower than an idle one.
			for {
				if stateKeys(r.Port) > 0 {
					break
				}
				if time.Since(back) > 30*time.Second {
					t.Fatalf("no decision reached Redis within 30 s of its return\n%s", p.stderr.String())
				}
				time.Sleep(10 * time.Millisecond)
			}
			onRedis := time.Since(back)
			var serving time.Duration
			if mode == "unavailable" {
				deadline := time.Now().Add(30 * time.Second)
				for {
					h, err := p.health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
					if err == nil && h.Status == healthpb.HealthCheckResponse_SERVING {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("health not SERVING 30 s after Redis returned: %v, %v", h, err)
					}
					time.Sleep(10 * time.Millisecond)
				}
				serving = time.Since(back)
			}
			after := calls.Load() + 200
			eventually(t, "200 calls after Redis is back", func() bool { return calls.Load() >= after })
			stopLoad.Store(true)
			wg.Wait()
			p.alive(t)
			inServer, over := latencyOver50ms(t, p)
			mu.Lock()
			slices.Sort(latencies)
			q := func(f float64) time.Duration {
				if len(latencies) == 0 {
					return 0
				}
				return latencies[min(len(latencies)-1, int(f*float64(len(latencies))))].Round(time.Microsecond)
			}
			t.Logf("reliability: Redis killed under load, mode %s: %d calls (%d UNAVAILABLE), client latency p50 %v p99 %v max %v; "+
				"in the server %d of %d RPCs over 50 ms; back on Redis %v after its restart, SERVING after %v",
				mode, calls.Load(), unavail.Load(), q(0.5), q(0.99), q(1), over, inServer,
				onRedis.Round(time.Millisecond), serving.Round(time.Millisecond))
			mu.Unlock()
			p.stop(t)
		})
	}
}

// TestRedisClusterServe serves on a 3-master Cluster: limits hold across
// slots, and a request whose descriptors span slots is decided.
func TestRedisClusterServe(t *testing.T) {
	nodes := redistest.Cluster(t, 3)
	bin := buildCharon(t)
	cfg := writeRedisConfig(t)
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.Addr())
	}
	p := startServe(t, bin, "--config", cfg, "--store", "redis", "--redis-url", "redis-cluster://"+strings.Join(addrs, ","),
		"--redis-timeout", "2s")
	for _, who := range []string{"dave", "erin", "frank"} {
		if got := burst(t, []*proc{p}, 3*testLimit, "user", who); got != testLimit {
			t.Errorf("burst of %d for %s on a Cluster: %d granted, want %d", 3*testLimit, who, got, testLimit)
		}
	}
	// Two descriptors in different slots, one over its limit: all or nothing.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	two := func(a, b string) *rlsv3.RateLimitResponse {
		resp, err := p.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
			Domain: "test",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{
				{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: a}}},
				{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: b}}},
			},
		})
		if err != nil {
			t.Fatalf("two-descriptor request: %v\n%s", err, p.stderr.String())
		}
		return resp
	}
	if resp := two("dave", "grace"); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("dave (spent) + grace: %v, want OVER_LIMIT", resp.OverallCode)
	}
	for i := 0; i < testLimit; i++ {
		if resp := two("grace", "heidi"); resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("grace + heidi #%d: %v, want OK (the rejected request must not have counted)", i, resp.OverallCode)
		}
	}
	if resp := two("grace", "ivan"); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("grace after %d: %v, want OVER_LIMIT", testLimit, resp.OverallCode)
	}
	p.stop(t)
}

// TestRedisSentinelServe serves through a Sentinel URL: the limit holds.
func TestRedisSentinelServe(t *testing.T) {
	s := redistest.Sentinel(t)
	bin := buildCharon(t)
	cfg := writeRedisConfig(t)
	p := startServe(t, bin, "--config", cfg, "--store", "redis",
		"--redis-url", "redis-sentinel://"+s.Sentinel.Addr()+"/"+s.MasterName, "--redis-timeout", "2s")
	if got := burst(t, []*proc{p}, 3*testLimit, "user", "judy"); got != testLimit {
		t.Errorf("burst of %d through Sentinel: %d granted, want %d", 3*testLimit, got, testLimit)
	}
	if n := stateKeys(s.Master.Port); n == 0 {
		t.Errorf("no state key on the master: the decisions did not reach it")
	}
	p.stop(t)
}
