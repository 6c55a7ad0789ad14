package engine

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/tiers"
)

// vclock is a virtual clock for pacing tests: Now reads it, Sleep blocks
// until Advance moves it past the sleeper's instant (or its context ends).
type vclock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []*vwaiter
	slept   chan time.Duration // a sleeper registered, with its wait
}

type vwaiter struct {
	at   time.Time
	done chan struct{}
}

func newVclock() *vclock { return &vclock{now: t0, slept: make(chan time.Duration, 64)} }

func (c *vclock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *vclock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	w := &vwaiter{at: c.now.Add(d), done: make(chan struct{})}
	c.waiters = append(c.waiters, w)
	c.mu.Unlock()
	c.slept <- d
	select {
	case <-w.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Advance moves the clock to at, waking every sleeper due by then.
func (c *vclock) Advance(at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = at
	kept := c.waiters[:0]
	for _, w := range c.waiters {
		if !w.at.After(at) {
			close(w.done)
		} else {
			kept = append(kept, w)
		}
	}
	c.waiters = kept
}

// set moves the clock without waking anyone (a request's arrival).
func (c *vclock) set(at time.Time) {
	c.mu.Lock()
	c.now = at
	c.mu.Unlock()
}

func pacedEngine(t *testing.T, clk *vclock, maxWaiting int, policy *tiers.Policy, pace time.Duration) *Engine {
	t.Helper()
	st := memstore.New(memstore.Options{})
	t.Cleanup(func() { st.Close() })
	return pacedEngineOn(t, st, clk, maxWaiting, policy, pace)
}

// pacedEngineOn is pacedEngine on the store st.
func pacedEngineOn(t *testing.T, st store.Store, clk *vclock, maxWaiting int, policy *tiers.Policy, pace time.Duration) *Engine {
	t.Helper()
	e := New(Options{Store: st, Now: clk.Now, Sleep: clk.Sleep, PaceMaxWaiting: maxWaiting})
	tree, err := descriptors.NewTree([]descriptors.DomainSpec{{Config: descriptors.DomainConfig{Name: "api"}, Nodes: []*descriptors.Node{
		{Key: "user", Limit: &descriptors.Limit{Policy: policy, Pace: pace}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	e.SetTree(tree)
	return e
}

type pacedAnswer struct {
	resp *Response
	err  error
}

// askPaced sends one request in its own goroutine and returns once it was
// answered or is waiting: the channel delivers its answer.
func askPaced(t *testing.T, e *Engine, clk *vclock, ctx context.Context) (<-chan pacedAnswer, time.Duration) {
	t.Helper()
	ch := make(chan pacedAnswer, 1)
	go func() {
		resp, err := e.ShouldRateLimit(ctx, &Request{Domain: "api", Descriptors: []Descriptor{desc("user", "alice")}})
		ch <- pacedAnswer{resp, err}
	}()
	select {
	case d := <-clk.slept:
		return ch, d
	case a := <-ch:
		ch2 := make(chan pacedAnswer, 1)
		ch2 <- a
		return ch2, 0
	case <-time.After(30 * time.Second):
		t.Fatal("a request neither answered nor waiting")
		return nil, 0
	}
}

// TestPaceBurstInOrder: a burst of twice the limit, 10 ms apart, on a
// paced rule (5 per second, pace 2s): the first five are granted at once,
// the other five held and granted one second after the hit whose slot they
// take, in the order they came, all OK, never more than five in a second.
func TestPaceBurstInOrder(t *testing.T) {
	clk := newVclock()
	rate := &tiers.Policy{Tiers: []tiers.Tier{{Limit: 5, Window: time.Second, Active: tiers.Unbounded}}}
	e := pacedEngine(t, clk, 0, rate, 2*time.Second)
	var chans []<-chan pacedAnswer
	for i := range 10 {
		clk.set(t0.Add(time.Duration(i) * 10 * time.Millisecond))
		ch, wait := askPaced(t, e, clk, context.Background())
		want := time.Duration(0)
		if i >= 5 {
			want = time.Second - 50*time.Millisecond
		}
		if wait != want {
			t.Fatalf("request %d: held %v, want %v", i, wait, want)
		}
		chans = append(chans, ch)
	}
	if got := e.Pace().Waiting(); got != 5 {
		t.Fatalf("%d waiting, want 5", got)
	}
	var granted []time.Time
	for i, ch := range chans {
		if i >= 5 {
			clk.Advance(t0.Add(time.Second + time.Duration(i-5)*10*time.Millisecond))
		}
		a := <-ch
		if a.err != nil || a.resp.Code != CodeOK {
			t.Fatalf("request %d: %v, %+v", i, a.err, a.resp)
		}
		granted = append(granted, a.resp.Now)
		if want := i >= 5; (a.resp.Paced > 0) != want {
			t.Errorf("request %d: Paced %v", i, a.resp.Paced)
		}
	}
	for i := range granted {
		want := t0.Add(time.Duration(i) * 10 * time.Millisecond)
		if i >= 5 {
			want = want.Add(time.Second - 50*time.Millisecond)
		}
		if !granted[i].Equal(want) {
			t.Errorf("request %d granted at +%v, want +%v", i, granted[i].Sub(t0), want.Sub(t0))
		}
		n := 0
		for _, g := range granted {
			if !g.Before(granted[i]) && g.Sub(granted[i]) < time.Second {
				n++
			}
		}
		if n > 5 {
			t.Errorf("%d grants in the second from +%v", n, granted[i].Sub(t0))
		}
	}
	if got := e.Pace().Granted(); got != 5 {
		t.Errorf("Granted %d, want 5", got)
	}
}

// TestPaceBounds: the waiting bound, the caller's deadline and the pace
// itself each turn a wait into an OVER_LIMIT answer at once.
func TestPaceBounds(t *testing.T) {
	rate := &tiers.Policy{Tiers: []tiers.Tier{{Limit: 1, Window: time.Second, Active: tiers.Unbounded}}}
	t.Run("bound", func(t *testing.T) {
		clk := newVclock()
		e := pacedEngine(t, clk, 2, rate, 10*time.Second)
		askPaced(t, e, clk, context.Background())
		_, w1 := askPaced(t, e, clk, context.Background())
		_, w2 := askPaced(t, e, clk, context.Background())
		if w1 != time.Second || w2 != 2*time.Second {
			t.Fatalf("held %v and %v, want 1s and 2s", w1, w2)
		}
		ch, w3 := askPaced(t, e, clk, context.Background())
		if a := <-ch; w3 != 0 || a.resp.Code != CodeOverLimit {
			t.Fatalf("third waiter: held %v, answered %+v; want OVER_LIMIT at once", w3, a.resp)
		}
		if e.Pace().Full() != 1 || e.Pace().Waiting() != 2 {
			t.Fatalf("full %d, waiting %d; want 1, 2", e.Pace().Full(), e.Pace().Waiting())
		}
		clk.Advance(t0.Add(time.Hour))
	})
	t.Run("deadline", func(t *testing.T) {
		clk := newVclock()
		e := pacedEngine(t, clk, 0, rate, 10*time.Second)
		askPaced(t, e, clk, context.Background())
		// Wall clock deadline: a second's wait does not fit in 500 ms.
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		ch, w := askPaced(t, e, clk, ctx)
		if a := <-ch; w != 0 || a.err != nil || a.resp.Code != CodeOverLimit {
			t.Fatalf("held %v, answered %+v (%v); want OVER_LIMIT at once", w, a.resp, a.err)
		}
	})
	t.Run("pace", func(t *testing.T) {
		clk := newVclock()
		e := pacedEngine(t, clk, 0, rate, 900*time.Millisecond)
		askPaced(t, e, clk, context.Background())
		ch, w := askPaced(t, e, clk, context.Background())
		if a := <-ch; w != 0 || a.resp.Code != CodeOverLimit || a.resp.Statuses[0].ResetAfter != time.Second {
			t.Fatalf("held %v, answered %+v; want OVER_LIMIT at once, reset 1s", w, a.resp)
		}
	})
}

// TestPaceCancelGivesBack: a caller that leaves while held gets its
// context's error, and its slot goes to the next request: held for the
// same instant.
func TestPaceCancelGivesBack(t *testing.T) {
	clk := newVclock()
	rate := &tiers.Policy{Tiers: []tiers.Tier{{Limit: 1, Window: time.Second, Active: tiers.Unbounded}}}
	e := pacedEngine(t, clk, 0, rate, 10*time.Second)
	askPaced(t, e, clk, context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	ch, w := askPaced(t, e, clk, ctx)
	if w != time.Second {
		t.Fatalf("held %v, want 1s", w)
	}
	cancel()
	if a := <-ch; !errors.Is(a.err, context.Canceled) {
		t.Fatalf("a cancelled wait answered %+v, %v; want context.Canceled", a.resp, a.err)
	}
	if e.Pace().Cancelled() != 1 || e.Pace().Waiting() != 0 {
		t.Fatalf("cancelled %d, waiting %d", e.Pace().Cancelled(), e.Pace().Waiting())
	}
	clk.set(t0.Add(100 * time.Millisecond))
	ch, w = askPaced(t, e, clk, context.Background())
	if w != 900*time.Millisecond {
		t.Fatalf("after the give-back, held %v, want 900ms (the slot at +1s)", w)
	}
	clk.Advance(t0.Add(time.Second))
	if a := <-ch; a.resp.Code != CodeOK || !a.resp.Now.Equal(t0.Add(time.Second)) {
		t.Fatalf("answered %+v", a.resp)
	}
}

// laggingStore is a store on its own clock, as Redis' TIME is: each call
// takes lat of the virtual clock and decides (or reserves from) the
// instant it ends, not the caller's now.
type laggingStore struct {
	*memstore.Store
	clk *vclock
	lat time.Duration
}

func (s laggingStore) Decide(ctx context.Context, _ time.Time, items []store.Item, out []tiers.Decision) error {
	s.clk.set(s.clk.Now().Add(s.lat))
	return s.Store.Decide(ctx, s.clk.Now(), items, out)
}

func (s laggingStore) Reserve(ctx context.Context, _ time.Time, after time.Duration, items []store.Item, out []tiers.Decision) (time.Time, error) {
	s.clk.set(s.clk.Now().Add(s.lat))
	return s.Store.Reserve(ctx, s.clk.Now(), after, items, out)
}

// TestPaceStoreClock: on a store whose calls decide at their own, later
// instant (Redis' clock, 3 ms a call), a held request is answered no
// sooner than the instant its reservation was made for: the hold runs the
// wait from the reservation's reply, not from the request's arrival (which
// answered it 6 ms before the window let it).
func TestPaceStoreClock(t *testing.T) {
	clk := newVclock()
	st := memstore.New(memstore.Options{})
	t.Cleanup(func() { st.Close() })
	e := New(Options{Store: laggingStore{st, clk, 3 * time.Millisecond}, Now: clk.Now, Sleep: clk.Sleep})
	rate := &tiers.Policy{Tiers: []tiers.Tier{{Limit: 1, Window: time.Second, Active: tiers.Unbounded}}}
	tree, err := descriptors.NewTree([]descriptors.DomainSpec{{Config: descriptors.DomainConfig{Name: "api"}, Nodes: []*descriptors.Node{
		{Key: "user", Limit: &descriptors.Limit{Policy: rate, Pace: 2 * time.Second}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	e.SetTree(tree)
	first, _ := askPaced(t, e, clk, context.Background()) // its hit at +3ms
	if a := <-first; a.err != nil || a.resp.Code != CodeOK {
		t.Fatalf("first request: %v %+v", a.err, a.resp)
	}
	clk.set(t0.Add(10 * time.Millisecond))
	ch, wait := askPaced(t, e, clk, context.Background())
	// Decided at +13ms: the slot frees at +1.003s, 990 ms on; reserved at
	// +16ms for 990 ms on: +1.006s, and held from +16ms.
	if wait != 990*time.Millisecond {
		t.Fatalf("held %v from the reservation's reply, want 990ms", wait)
	}
	clk.Advance(t0.Add(1006 * time.Millisecond))
	a := <-ch
	if a.err != nil || a.resp.Code != CodeOK || !a.resp.Now.Equal(t0.Add(1006*time.Millisecond)) {
		t.Fatalf("paced request: %v %+v, want OK granted at +1.006s", a.err, a.resp)
	}
}

// refusingReserver reserves nothing and gives nothing back: a Cluster
// store whose keys span slots, or a store that failed.
type refusingReserver struct{ *memstore.Store }

func (refusingReserver) Reserve(context.Context, time.Time, time.Duration, []store.Item, []tiers.Decision) (time.Time, error) {
	return time.Time{}, store.ErrCannotReserve
}

// TestPaceUnreservedCounted: a paced request whose grant the store does
// not reserve is answered as first decided, OVER_LIMIT, and counted, not
// silently unpaced.
func TestPaceUnreservedCounted(t *testing.T) {
	clk := newVclock()
	st := memstore.New(memstore.Options{})
	t.Cleanup(func() { st.Close() })
	rate := &tiers.Policy{Tiers: []tiers.Tier{{Limit: 1, Window: time.Second, Active: tiers.Unbounded}}}
	e := pacedEngineOn(t, refusingReserver{st}, clk, 0, rate, 2*time.Second)
	for i, want := range []Code{CodeOK, CodeOverLimit} {
		ch, _ := askPaced(t, e, clk, context.Background())
		if a := <-ch; a.err != nil || a.resp.Code != want {
			t.Fatalf("request %d: %v %+v, want %v", i, a.err, a.resp, want)
		}
	}
	if e.Pace().Unreserved() != 1 || e.Pace().Granted() != 0 {
		t.Errorf("unreserved %d, granted %d; want 1 and 0", e.Pace().Unreserved(), e.Pace().Granted())
	}
}

// failingGiveBack reserves as the memory store does and fails every
// give-back.
type failingGiveBack struct{ *memstore.Store }

func (failingGiveBack) GiveBack(context.Context, time.Time, time.Time, []store.Item) error {
	return errors.New("redis: connection refused")
}

// TestPaceGiveBackFailedCounted: a cancelled wait whose give-back the store
// fails is counted.
func TestPaceGiveBackFailedCounted(t *testing.T) {
	clk := newVclock()
	st := memstore.New(memstore.Options{})
	t.Cleanup(func() { st.Close() })
	rate := &tiers.Policy{Tiers: []tiers.Tier{{Limit: 1, Window: time.Second, Active: tiers.Unbounded}}}
	e := pacedEngineOn(t, failingGiveBack{st}, clk, 0, rate, 2*time.Second)
	askPaced(t, e, clk, context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	ch, w := askPaced(t, e, clk, ctx)
	if w <= 0 {
		t.Fatal("the second request was not held")
	}
	cancel()
	<-ch
	if e.Pace().Cancelled() != 1 || e.Pace().GiveBackFailed() != 1 {
		t.Errorf("cancelled %d, give-backs failed %d; want 1 and 1", e.Pace().Cancelled(), e.Pace().GiveBackFailed())
	}
}
