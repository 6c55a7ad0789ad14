package main

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/charonlimit/charon/internal/redistest"
)

// TestRedisSlowed puts 2 × 40 ms between the server and a Redis that keeps
// answering, in every failure mode: callers allowing 20 ms (Envoy's
// default) get the failure mode's answer, or UNAVAILABLE in that mode,
// never another error. No answer comes back within their deadlines, so the
// breaker may open (Redis is as good as down for them); once its probe has
// closed it, callers allowing 5 s get Redis's decisions: exactly the limit.
func TestRedisSlowed(t *testing.T) {
	bin := buildCharon(t)
	cfg := writeRedisConfig(t)
	for _, mode := range []string{"local", "open", "closed", "unavailable"} {
		t.Run(mode, func(t *testing.T) {
			r := redistest.Single(t)
			fp := newFaultProxy(t, r.Addr(), 40*time.Millisecond)
			fp.mode.Store(proxySlow) // a Redis that answers, slowly
			p := startServe(t, bin, "--config", cfg, "--store", "redis", "--redis-url", "redis://"+fp.addr, "--failure-mode", mode)

			var other, unavailable, answered atomic.Int64
			var first atomic.Value
			var wg sync.WaitGroup
			for w := 0; w < 4; w++ {
				wg.Add(1)
				go func(w int) {
					defer wg.Done()
					for i := 0; i < 25; i++ {
						ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
						_, err := p.ask(ctx, "load", "v")
						cancel()
						switch status.Code(err) {
						case codes.OK:
							answered.Add(1)
						case codes.Unavailable:
							unavailable.Add(1)
						case codes.DeadlineExceeded: // the client's own clock: a busy machine
						default:
							other.Add(1)
							first.CompareAndSwap(nil, err.Error())
						}
					}
				}(w)
			}
			wg.Wait()
			if other.Load() != 0 {
				t.Errorf("%d RPCs failed otherwise; first: %v", other.Load(), first.Load())
			}
			if mode != "unavailable" && unavailable.Load() != 0 {
				t.Errorf("%d UNAVAILABLE in mode %s", unavailable.Load(), mode)
			}
			// Callers that allow the time get Redis's decisions once the
			// breaker's probe (PING within 1 s) has closed it: exactly the
			// limit.
			deadline := time.Now().Add(30 * time.Second)
			for metricValue(get(t, "http://"+p.debugAddr+"/metrics"), "charon_store_breaker_state") != 0 {
				if time.Now().After(deadline) {
					t.Fatal("the breaker did not close within 30 s though Redis answers its probes")
				}
				time.Sleep(50 * time.Millisecond)
			}
			granted := 0
			for i := 0; i < testLimit+5; i++ {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				resp, err := p.ask(ctx, "user", "slow-"+mode)
				cancel()
				if err != nil {
					t.Fatalf("a caller allowing 5 s: %v", err)
				}
				if resp.OverallCode == 1 { // OK
					granted++
				}
			}
			m := get(t, "http://"+p.debugAddr+"/metrics")
			t.Logf("reliability: Redis 2 x 40 ms away, mode %s: of 100 RPCs allowing 20 ms, %d answered, %d UNAVAILABLE; then %d of %d granted to callers allowing 5 s; breaker opened %v times",
				mode, answered.Load(), unavailable.Load(), granted, testLimit+5, metricValue(m, "charon_store_breaker_opens_total"))
			if granted != testLimit {
				t.Errorf("%d granted to patient callers, want exactly %d (Redis's decisions)", granted, testLimit)
			}
		})
	}
}
