package resilient_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/charonlimit/charon/internal/redistest"
	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/redisstore"
	"github.com/charonlimit/charon/internal/store/resilient"
	"github.com/charonlimit/charon/tiers"
)

var errSwallowed = errors.New("test: reply swallowed")

// swallower is a scripted go-redis hook that, once on, holds every command
// (alone or in a pipeline) until released or its context ends, then fails
// it: a Redis that stopped answering, its connections left open.
type swallower struct {
	on      atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func newSwallower() *swallower {
	return &swallower{entered: make(chan struct{}, 1), release: make(chan struct{})}
}

func (w *swallower) hold(ctx context.Context) error {
	select {
	case w.entered <- struct{}{}:
	default:
	}
	select {
	case <-w.release:
		return errSwallowed
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (w *swallower) hook() *redistest.Hook {
	return &redistest.Hook{
		Process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
			if w.on.Load() {
				err := w.hold(ctx)
				cmd.SetErr(err)
				return err
			}
			return next(ctx, cmd)
		},
		Pipeline: func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
			if w.on.Load() {
				err := w.hold(ctx)
				for _, cmd := range cmds {
					cmd.SetErr(err)
				}
				return err
			}
			return next(ctx, cmds)
		},
	}
}

// TestStuckCallsOpenTheBreaker: Redis stops answering while a call is in
// flight on the only dispatcher. The calls queued behind it are not sent
// before their deadlines, and each is evidence of the outage (it waited
// behind Redis' silence): the breaker opens at the threshold's third such
// call, before the call in flight has timed out, and releases that call
// (its caller allows a minute) to the failure mode; a later call is
// answered by the failure mode without being queued. Once Redis answers
// again, a probe closes the breaker and Redis decides. The breaker runs on an injected clock; nothing here depends on
// how long a call took.
func TestStuckCallsOpenTheBreaker(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	n := redistest.Single(t)
	c := redistest.Client(t, n)
	w := newSwallower()
	h := w.hook()
	c.AddHook(h)
	remote, err := redisstore.NewWithClient(c, redisstore.Options{Pipelines: 1, KeyPrefix: "stuck:"})
	if err != nil {
		t.Fatal(err)
	}
	clk := newClock()
	s := resilient.New(remote, resilient.Options{FailureThreshold: 3, FailureRate: -1, CacheSize: -1, Now: clk.Now})
	defer s.Close()
	decide := func(ctx context.Context, domain string) error {
		out := make([]tiers.Decision, 1)
		err := s.Decide(ctx, t0, []store.Item{take(simple, domain, 1)}, out)
		if err == nil && !out[0].OK {
			t.Errorf("%s: %+v, want a grant", domain, out[0])
		}
		return err
	}
	long := func() context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		t.Cleanup(cancel)
		return ctx
	}
	if err := decide(long(), "warm"); err != nil { // loads the function
		t.Fatal(err)
	}
	if st := s.Stats(); st.Remote != 1 {
		t.Fatalf("warm-up: %+v, want decided by Redis", st)
	}

	w.on.Store(true)
	inFlight := make(chan error, 1)
	go func() { inFlight <- decide(long(), "a") }()
	<-w.entered // a's batch is on the wire, its reply swallowed
	for i := 1; i <= 3; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		err := decide(ctx, "b")
		cancel()
		if err != nil {
			t.Fatalf("stuck call %d: %v, want the local failure mode's answer", i, err)
		}
		st := s.Stats()
		// The third call opens the breaker, which releases the call in
		// flight to the failure mode: it may be answered (Local) already.
		local := st.Local == uint64(i) || (i == 3 && st.Local == 4)
		if st.Stuck != uint64(i) || st.NotSent != uint64(i) || st.Timeouts != uint64(i) || !local {
			t.Fatalf("after stuck call %d: %+v; want %d stuck (not sent, timed out), answered locally", i, st, i)
		}
		if want := i == 3; (st.Breaker == resilient.BreakerOpen) != want || st.BreakerOpens != map[bool]uint64{false: 0, true: 1}[want] {
			t.Fatalf("after stuck call %d: %+v; want the breaker open only at the third (threshold 3)", i, st)
		}
	}
	// The opening released the call in flight, whose caller allows a
	// minute and whose reply is still swallowed: the failure mode answers
	// it now.
	if err := <-inFlight; err != nil {
		t.Fatalf("the call in flight: %v, want the local answer", err)
	}
	if st := s.Stats(); st.Local != 4 || st.Timeouts != 3 || st.BreakerOpens != 1 {
		t.Errorf("after the call in flight was released: %+v; want it answered locally, not counted as a timeout", st)
	}
	cmds, pipes := h.Sent()
	if err := decide(long(), "c"); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	if st.Local != 5 || st.Stuck != 3 || st.NotSent != 3 || st.Timeouts != 3 || st.Breaker != resilient.BreakerOpen {
		t.Errorf("a call while the breaker is open: %+v; want answered locally at once, not queued for Redis", st)
	}
	if c2, p2 := h.Sent(); c2 != cmds || p2 != pipes {
		t.Errorf("the client sent %d commands and %d pipelines meanwhile, want none", c2-cmds, p2-pipes)
	}

	// Redis answers again (the swallowed call fails: no reply to give
	// back); a probe after the cool-off closes the breaker.
	w.on.Store(false)
	close(w.release)
	clk.Advance(resilient.DefaultCoolOff)
	if err := s.Probe(context.Background()); err != nil {
		t.Fatalf("probe: %v", err)
	}
	if err := decide(long(), "d"); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Breaker != resilient.BreakerClosed || st.Remote != 2 {
		t.Errorf("after the probe: %+v; want the breaker closed and Redis deciding", st)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.Settle(ctx); err != nil {
		t.Fatal(err)
	}
	if lost := remote.LateLost(); lost != 1 {
		t.Errorf("%d released calls lost, want 1 (a's, whose reply never came)", lost)
	}
}
