package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestReloadStormThenSIGTERMUnderLoad: while clients decide in a loop, the
// configuration is rewritten 40 times (every reload succeeds, no request
// fails), then SIGTERM drains: decisions go on during the drain, afterwards
// only UNAVAILABLE (the server is gone), and the process exits 0.
func TestReloadStormThenSIGTERMUnderLoad(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "storm.yaml")
	write := func(limit int) {
		body := fmt.Sprintf("domain: storm\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: %d}\n", limit)
		// A name starting with "." is never loaded: every other file of
		// the directory is, as envoyproxy/ratelimit loads it.
		tmp := filepath.Join(dir, ".storm.yaml.tmp")
		if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, file); err != nil {
			t.Fatal(err)
		}
	}
	write(1000)
	p := startServeEnv(t, buildCharon(t), nil, "--config", dir, "--shutdown-delay", "1s")
	var (
		ok, failedBefore, unavailable, other atomic.Int64
		stopping                             atomic.Bool
		firstOther                           atomic.Value
		wg                                   sync.WaitGroup
		done                                 = make(chan struct{})
	)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err := p.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "storm",
					Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: fmt.Sprint(w, "-", i%50)}}}}})
				cancel()
				switch {
				case err == nil:
					ok.Add(1)
				case !stopping.Load():
					failedBefore.Add(1)
					firstOther.CompareAndSwap(nil, err.Error())
				case status.Code(err) == codes.Unavailable:
					unavailable.Add(1)
				default:
					other.Add(1)
					firstOther.CompareAndSwap(nil, err.Error())
				}
			}
		}(w)
	}
	// loaded waits, with a deadline, until the configuration in force has
	// the limit written last.
	loaded := func(limit int) {
		deadline := time.Now().Add(30 * time.Second)
		for !strings.Contains(get(t, "http://"+p.debugAddr+"/rlconfig"), fmt.Sprintf("limit: %d\n", limit)) {
			if time.Now().After(deadline) {
				t.Fatalf("the write of limit %d was not loaded in 30 s\n%s", limit, p.stderr.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// Forty writes: ten at a time back to back (several land between two
	// polls, 500 ms apart), each ten loaded before the next.
	for i := 0; i < 40; i++ {
		write(1000 + i)
		if i%10 == 9 {
			loaded(1000 + i)
		}
	}
	m := get(t, "http://"+p.debugAddr+"/metrics")
	if n := metricValue(m, `charon_config_reloads_total{result="failure"}`); n != 0 {
		t.Errorf("%v reloads failed during the storm", n)
	}
	if n := metricValue(m, `charon_config_reloads_total{result="success"}`); n < 2 {
		t.Errorf("%v successful reloads, want several", n)
	}
	before := ok.Load()
	stopping.Store(true)
	p.stop(t) // SIGTERM: the drain, then exit 0
	close(done)
	wg.Wait()
	t.Logf("reliability: reload storm and SIGTERM under load: %d decisions before SIGTERM, %d during the drain, then %d UNAVAILABLE", before, ok.Load()-before, unavailable.Load())
	if failedBefore.Load() != 0 || other.Load() != 0 {
		t.Errorf("%d failures before SIGTERM, %d other than UNAVAILABLE after; first: %v", failedBefore.Load(), other.Load(), firstOther.Load())
	}
	if ok.Load() == before {
		t.Error("no decision during the drain")
	}
}

// TestMillionValuesBounded (make reliability only: CHARON_RELIABILITY=1)
// sends 1,000,000 distinct values to a server bounded by --max-keys 100000:
// evictions are counted, the RSS stays bounded and /metrics does not grow
// with the values.
func TestMillionValuesBounded(t *testing.T) {
	if os.Getenv("CHARON_RELIABILITY") == "" {
		t.Skip("make reliability runs it (CHARON_RELIABILITY=1)")
	}
	p := startServeEnv(t, buildCharon(t), nil, "--config", writeRedisConfig(t), "--max-keys", "100000")
	const n, workers = 1_000_000, 16
	var next atomic.Int64
	var failed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > n {
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := p.ask(ctx, "user", fmt.Sprint("v", i))
				cancel()
				if err != nil {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	m := get(t, "http://"+p.debugAddr+"/metrics")
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	var rssKiB int64
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			fmt.Sscan(v, &rssKiB)
		}
	}
	evicted := metricValue(m, "charon_store_evictions_total")
	t.Logf("reliability: 1,000,000 distinct values in %v against --max-keys 100000: RSS %d MiB, %v evictions, /metrics %d lines, %d failed",
		time.Since(start).Round(time.Second), rssKiB/1024, evicted, strings.Count(m, "\n"), failed.Load())
	if failed.Load() != 0 {
		t.Errorf("%d requests failed", failed.Load())
	}
	if evicted < n-100_000-1000 {
		t.Errorf("%v evictions, want about %d", evicted, n-100_000)
	}
	if rssKiB > 768*1024 {
		t.Errorf("RSS %d MiB: more than 768 MiB for 100,000 tracked pairs", rssKiB/1024)
	}
	if lines := strings.Count(m, "\n"); lines > 2000 {
		t.Errorf("/metrics has %d lines: series grow with the values", lines)
	}
	p.stop(t)
}
