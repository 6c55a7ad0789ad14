package resilient_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/resilient"
	"github.com/charonlimit/charon/tiers"
)

var hourly = &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 50, Window: time.Hour, Active: tiers.Unbounded}}}

// TestConcurrentHotKeyExact: with the cache answering most of a hot key's
// rejections, concurrent callers still get exactly the limit.
func TestConcurrentHotKeyExact(t *testing.T) {
	f := newFake()
	s := resilient.New(f, resilient.Options{})
	defer s.Close()
	const workers, calls = 8, 200
	var grants atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			out := make([]tiers.Decision, 1)
			for c := range calls {
				now := t0.Add(time.Duration(w*calls+c) * time.Microsecond)
				if err := s.Decide(context.Background(), now, []store.Item{take(hourly, "hot", 1)}, out); err != nil {
					t.Error(err)
					return
				}
				if out[0].OK {
					grants.Add(1)
				}
			}
		})
	}
	wg.Wait()
	st := s.Stats()
	if grants.Load() != 50 || st.Remote+st.Cached != workers*calls || st.Cached == 0 {
		t.Errorf("%d grants, stats %+v; want 50 grants, every call remote or cached, some cached", grants.Load(), st)
	}
}

// TestConcurrentChaos runs callers against a remote that comes and goes,
// with flushes, refunds and stats readers, for the race detector; every call
// is counted once.
func TestConcurrentChaos(t *testing.T) {
	for _, mode := range []resilient.Mode{resilient.ModeLocal, resilient.ModeOpen, resilient.ModeClosed, resilient.ModeUnavailable} {
		t.Run(mode.String(), func(t *testing.T) {
			f := newFake()
			clk := newClock()
			var changes atomic.Int64
			s := resilient.New(f, resilient.Options{Mode: mode, Now: clk.Now, FailureThreshold: 2, CoolOff: time.Millisecond, CacheSize: 256,
				OnBreakerChange: func(resilient.BreakerState) { changes.Add(1) }})
			const workers, calls = 6, 300
			var answered, failed atomic.Int64
			var wg, side sync.WaitGroup
			var stop atomic.Bool
			side.Go(func() {
				for i := 0; !stop.Load(); i++ {
					f.set([]int32{answer, answer, fail}[i%3])
					clk.Advance(time.Millisecond)
					if i%7 == 0 {
						s.Flush()
					}
					_ = s.Stats()
					_ = s.Serving()
					_ = s.Probe(context.Background())
				}
			})
			for w := range workers {
				wg.Go(func() {
					out := make([]tiers.Decision, 3)
					for c := range calls {
						items := []store.Item{take(simple, "hot", 1), take(hourly, fmt.Sprint("w", w), 1)}
						if c%5 == 0 {
							items = append(items, refund(simple, "hot", 1))
						} else if c%2 == 0 {
							items = items[:1]
						}
						now := t0.Add(time.Duration(c) * time.Millisecond)
						if err := s.Decide(context.Background(), now, items, out); err != nil {
							if mode != resilient.ModeUnavailable {
								t.Error(err)
								return
							}
							failed.Add(1)
							continue
						}
						answered.Add(1)
					}
				})
			}
			wg.Wait()
			stop.Store(true)
			side.Wait()
			st := s.Stats()
			total := st.Remote + st.Cached + st.Local + st.Open + st.Closed + st.Unavailable
			if total != workers*calls || int64(st.Unavailable) != failed.Load() {
				t.Errorf("stats %+v count %d calls, want %d (%d failed)", st, total, workers*calls, failed.Load())
			}
			if err := s.Close(); err != nil {
				t.Error(err)
			}
		})
	}
}
