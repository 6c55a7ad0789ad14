package main

import (
	"context"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/charonlimit/charon/internal/redistest"
)

// TestRedisFaultDeadlines (make reliability only: CHARON_RELIABILITY=1)
// measures how many of Envoy's 20 ms calls end in the caller's own
// DeadlineExceeded while Redis does not answer in time, the failure mode
// deciding: Redis blackholed and back in turn (a black hole's first calls
// wait for their margin, then the breaker answers at once; the probe closes
// it when Redis is back), and Redis 2 × 40 ms away (the calls on the wire
// wait for their margin, as do those queued behind them, which open the
// breaker: Redis' late replies come after 80 ms, so a caller's 15 ms mostly
// sees none; the probe closes it again, Redis answering a PING within its
// second). Run it with
// every core busy (scripts/test-stress.sh's hogs) for the figure that
// matters; a first part with Redis healthy is the control (the calls the
// machine alone makes late). CHARON_FAULT_SECONDS (default 30) is each
// part's length. With Redis blackholed it also counts the calls begun in
// the first second after each closing of the breaker (/metrics polled
// every 20 ms, in every part)
// that end before the next black hole begins: recovery, to compare with
// the control. (Counted up to the next hole's start instead, the next
// fault's first calls, which wait for their margin, were taken for slow
// recoveries: with a 1.5 s healthy phase the next hole begins 0.5-1.1 s
// after the breaker closes.)
func TestRedisFaultDeadlines(t *testing.T) {
	if os.Getenv("CHARON_RELIABILITY") == "" {
		t.Skip("make reliability runs it (CHARON_RELIABILITY=1)")
	}
	secs, _ := strconv.Atoi(os.Getenv("CHARON_FAULT_SECONDS"))
	if secs <= 0 {
		secs = 30
	}
	bin := buildCharon(t)
	cfg := writeRedisConfig(t)
	for _, fault := range []string{"healthy", "blackholed", "slowed"} {
		t.Run(fault, func(t *testing.T) {
			r := redistest.Single(t)
			fp := newFaultProxy(t, r.Addr(), 40*time.Millisecond)
			p := startServe(t, bin, "--config", cfg, "--store", "redis", "--redis-url", "redis://"+fp.addr, "--failure-mode", "local")
			var (
				stop               atomic.Bool
				calls, late, other atomic.Int64
				rec                recovery
				lateInFault        atomic.Int64 // late calls that began or ended while the proxy swallowed or delayed
				first              atomic.Value
				wg                 sync.WaitGroup
			)
			for w := range 4 {
				wg.Go(func() {
					for i := 0; !stop.Load(); i++ {
						ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
						inFault := fp.mode.Load() != proxyPass
						began := time.Now()
						_, err := p.ask(ctx, "load", "v"+strconv.Itoa(w*1000+i%1000))
						cancel()
						calls.Add(1)
						rec.call(began, status.Code(err) == codes.DeadlineExceeded)
						switch status.Code(err) {
						case codes.OK:
						case codes.DeadlineExceeded:
							late.Add(1)
							if inFault || fp.mode.Load() != proxyPass {
								lateInFault.Add(1)
							}
						default:
							other.Add(1)
							first.CompareAndSwap(nil, err.Error())
						}
					}
				})
			}
			{
				// In every part, so that the control pays for it too.
				wg.Go(func() {
					for open := false; !stop.Load(); time.Sleep(20 * time.Millisecond) {
						now := metricValue(get(t, "http://"+p.debugAddr+"/metrics"), "charon_store_breaker_state") == 1
						if open && !now {
							rec.closed(time.Now())
						}
						open = now
					}
				})
			}
			end := time.Now().Add(time.Duration(secs) * time.Second)
			switch fault {
			case "healthy":
				time.Sleep(time.Until(end)) // the measurement's length
			case "slowed":
				fp.mode.Store(proxySlow)
				time.Sleep(time.Until(end))
			default:
				for time.Now().Before(end) {
					rec.hole(time.Now())
					fp.mode.Store(proxyHole)
					time.Sleep(1500 * time.Millisecond) // the fault's length
					fp.mode.Store(proxyPass)
					time.Sleep(1500 * time.Millisecond)
				}
			}
			stop.Store(true)
			wg.Wait()
			m := get(t, "http://"+p.debugAddr+"/metrics")
			timeouts := metricValue(m, "charon_store_remote_timeouts_total")
			local := metricValue(m, `charon_store_calls_total{path="local"}`)
			stuck := metricValue(m, "charon_store_not_sent_stuck_total")
			t.Logf("reliability: Redis %s, callers allowing 20 ms, mode local: %d calls, %d DeadlineExceeded (%.3f%%; %d begun or ended while the fault was on), %d other errors; %.0f answered by the failure mode, %.0f of them after waiting for the margin (remote timeouts, %.0f of which queued behind an unanswered batch), %.0f not sent otherwise, %.0f breaker openings",
				fault, calls.Load(), late.Load(), 100*float64(late.Load())/float64(max(calls.Load(), 1)), lateInFault.Load(), other.Load(),
				local, timeouts, stuck, metricValue(m, "charon_store_not_sent_total")-stuck, metricValue(m, "charon_store_breaker_opens_total"))
			if fault == "blackholed" {
				n, l, closes := rec.count()
				t.Logf("reliability: Redis blackholed, the first second after each of %d closings of the breaker: %d calls, %d DeadlineExceeded (%.3f%%); the breaker closed %v after the black holes ended",
					closes, n, l, 100*float64(l)/float64(max(n, 1)), rec.lags(1500*time.Millisecond))
			}
			if other.Load() != 0 {
				t.Errorf("%d calls failed otherwise than by the caller's deadline; first: %v", other.Load(), first.Load())
			}
		})
	}
}

// recovery counts the calls begun in the first second after a closing of
// the breaker that end (20 ms) before the next black hole begins.
type recovery struct {
	mu            sync.Mutex
	closes, holes []time.Time
	began         []time.Time
	lateBegan     []time.Time
}

func (r *recovery) call(began time.Time, late bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.began = append(r.began, began)
	if late {
		r.lateBegan = append(r.lateBegan, began)
	}
}

func (r *recovery) closed(at time.Time) { r.mu.Lock(); r.closes = append(r.closes, at); r.mu.Unlock() }
func (r *recovery) hole(at time.Time)   { r.mu.Lock(); r.holes = append(r.holes, at); r.mu.Unlock() }

// count returns the calls in recovery, the late ones among them, and the
// closings.
func (r *recovery) count() (calls, late, closes int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	in := func(x time.Time) bool {
		for _, c := range r.closes {
			if x.Before(c) || x.Sub(c) >= time.Second {
				continue
			}
			for _, h := range r.holes {
				if h.After(c) && h.Before(x.Add(20*time.Millisecond)) {
					return false
				}
			}
			return true
		}
		return false
	}
	for _, b := range r.began {
		if in(b) {
			calls++
		}
	}
	for _, b := range r.lateBegan {
		if in(b) {
			late++
		}
	}
	return calls, late, len(r.closes)
}

// lags returns, for each black hole (of length d), the time from its end to
// the next closing of the breaker.
func (r *recovery) lags(d time.Duration) []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []time.Duration
	for _, h := range r.holes {
		for _, c := range r.closes {
			if c.After(h.Add(d)) {
				out = append(out, c.Sub(h.Add(d)).Round(10*time.Millisecond))
				break
			}
		}
	}
	return out
}
