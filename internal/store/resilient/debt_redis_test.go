package resilient_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/charonlimit/charon/internal/redisconn"
	"github.com/charonlimit/charon/internal/redistest"
	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/redisstore"
	"github.com/charonlimit/charon/internal/store/resilient"
	"github.com/charonlimit/charon/tiers"
)

// fcalls reads the FCALLs a Redis node has run (INFO commandstats).
func fcalls(t *testing.T, n *redistest.Node) int64 {
	t.Helper()
	info, err := redistest.Client(t, n).Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_fcall:calls="); ok {
			v, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
			return v
		}
	}
	return 0
}

// TestPostPaidFloodRedisCalls floods one post-paid pair in debt on a real
// Redis with 20,000 requests from 16 callers, through the production
// stack (the Redis store behind the wrapper): every request is refused, by
// this process and by another one asking Redis meanwhile; Redis runs a call
// per flush interval (20 ms), not one per request, counted by its own
// commandstats; and once settled it holds every refused hit, debited
// exactly once. The same flood with DebtInterval -1 (one call per request)
// is measured beside it for the record.
func TestPostPaidFloodRedisCalls(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	n := redistest.Single(t)
	open := func(opts resilient.Options) *resilient.Store {
		c, err := redisconn.Open(redisconn.Options{URL: "redis://" + n.Addr()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		r, err := redisstore.NewWithClient(c, redisstore.Options{Clock: redisstore.ClockCaller})
		if err != nil {
			t.Fatal(err)
		}
		opts.Timeout = 5 * time.Second
		s := resilient.New(r, opts)
		t.Cleanup(func() { s.Close() })
		return s
	}
	// 10 an hour, post-paid: a debt that lasts the test.
	pp := &tiers.Policy{Kind: tiers.KindTiers, Overdraft: true, Tiers: []tiers.Tier{{Limit: 10, Window: time.Hour, Active: tiers.Unbounded}}}
	const requests, callers = 20_000, 16
	for _, tc := range []struct {
		name     string
		interval time.Duration
	}{{"summed", 0}, {"one call per request", -1}} {
		t.Run(tc.name, func(t *testing.T) {
			s := open(resilient.Options{DebtInterval: tc.interval})
			other := open(resilient.Options{CacheSize: -1})
			key := store.Key{Resource: "flood", Domain: tc.name, PolicyID: 1}
			it := func(hits int64) []store.Item { return []store.Item{{Key: key, Policy: pp, Hits: hits, Min: hits}} }
			out := make([]tiers.Decision, 1)
			if err := s.Decide(context.Background(), time.Now(), it(10), out); err != nil || !out[0].OK {
				t.Fatalf("setup: %v %+v, want the grant of the whole limit", err, out[0])
			}
			if err := s.Decide(context.Background(), time.Now(), it(1), out); err != nil || out[0].OK {
				t.Fatalf("setup: %v %+v, want a refusal (1 owed)", err, out[0])
			}
			before := fcalls(t, n)
			var granted, failed, otherGranted, next atomic.Int64
			var wg sync.WaitGroup
			start := time.Now()
			for range callers {
				wg.Go(func() {
					out := make([]tiers.Decision, 1)
					for next.Add(1) <= requests {
						if err := s.Decide(context.Background(), time.Now(), it(1), out); err != nil {
							failed.Add(1)
						} else if out[0].OK {
							granted.Add(1)
						}
					}
				})
			}
			stopOther := make(chan struct{})
			var otherWG sync.WaitGroup
			otherWG.Go(func() {
				out := make([]tiers.Decision, 1)
				for {
					select {
					case <-stopOther:
						return
					default:
					}
					if err := other.Decide(context.Background(), time.Now(), it(1), out); err == nil && out[0].OK {
						otherGranted.Add(1)
					}
					time.Sleep(5 * time.Millisecond)
				}
			})
			wg.Wait()
			elapsed := time.Since(start)
			close(stopOther)
			otherWG.Wait()
			if err := s.Settle(context.Background()); err != nil {
				t.Fatal(err)
			}
			calls := fcalls(t, n) - before
			st, ost := s.Stats(), other.Stats()
			t.Logf("reliability: a post-paid pair in debt flooded with %d requests (%s) in %v: %d Redis calls (%.0f/s; the other process's %d included), %d answered from the process, %d flushes",
				requests, tc.name, elapsed.Round(time.Millisecond), calls, float64(calls)/elapsed.Seconds(), ost.Remote, st.Cached, st.DebtFlushes)
			if granted.Load() != 0 || failed.Load() != 0 || otherGranted.Load() != 0 {
				t.Errorf("%d granted, %d failed, %d granted to the other process: want every request refused", granted.Load(), failed.Load(), otherGranted.Load())
			}
			v, err := s.Inspect(context.Background(), time.Now(), &it(1)[0])
			if err != nil {
				t.Fatal(err)
			}
			if want := int64(11 + requests + ost.Remote); v.Tiers[0].Hits != want {
				t.Errorf("Redis holds %d hits, want %d: every refused hit debited once", v.Tiers[0].Hits, want)
			}
			if tc.interval < 0 {
				return
			}
			// The wrapper's own calls: the requests it could not answer
			// (before the first rejection was cached: at most one per
			// caller) and one flush per interval at most.
			own := calls - int64(ost.Remote)
			if bound := int64(callers) + 1 + int64(elapsed/resilient.DefaultDebtInterval) + 1; own > bound {
				t.Errorf("%d Redis calls of this process in %v, want at most %d: the callers' first requests and one per %v", own, elapsed, bound, resilient.DefaultDebtInterval)
			}
			if st.DebtFlushes > uint64(elapsed/resilient.DefaultDebtInterval)+2 {
				t.Errorf("%d flushes in %v: more than one per %v", st.DebtFlushes, elapsed, resilient.DefaultDebtInterval)
			}
		})
	}
}
