package redisstore

import (
	"context"
	"errors"
	"runtime"
	"testing"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/storetest"
	"github.com/charonlimit/charon/tiers"
)

// TestStuckWatch: a call is stuck only when every dispatcher has had a
// batch in flight since the call was queued (its mark): not while a
// dispatcher is idle, nor once a dispatcher took a newer batch (it was
// answered, or gave up, meanwhile), nor without dispatchers.
func TestStuckWatch(t *testing.T) {
	var w stuckWatch
	if w.stuck(w.mark()) {
		t.Error("no dispatchers: stuck")
	}
	w.dispatchers = 2
	w.begin()
	m := w.mark()
	if w.stuck(m) {
		t.Error("one of two dispatchers idle: stuck")
	}
	w.begin()
	if w.stuck(m) {
		t.Error("the second dispatcher took a batch after the mark: stuck")
	}
	m = w.mark()
	if !w.stuck(m) {
		t.Error("both dispatchers in flight since the mark: not stuck")
	}
	w.end()
	if w.stuck(m) {
		t.Error("a dispatcher's batch ended: stuck")
	}
	w.begin()
	if w.stuck(m) {
		t.Error("a dispatcher took a newer batch: stuck")
	}
	if !w.stuck(w.mark()) {
		t.Error("both in flight since a new mark: not stuck")
	}
}

// TestRelease holds a dispatcher's pipeline in flight with a call on it
// and another queued behind it: Release makes both give up at once (the
// queued one not sent, stuck), a call made afterwards waits as usual and
// is answered once the pipeline returns, and what the released call in
// flight was granted is given back when its reply comes.
func TestRelease(t *testing.T) {
	_, c := singleClient(t)
	var g gate
	c.AddHook(g.hook())
	s := testStore(t, c, Options{Clock: ClockCaller, Pipelines: 1})
	defer s.Close()
	storetest.Decide(t, s, storetest.T0, item(lyft, "a", "x", 1)) // loads the function
	g.arm()
	run := func(hits int64) chan error {
		ch := make(chan error, 1)
		go func() {
			out := make([]tiers.Decision, 1)
			ch <- s.Decide(context.Background(), storetest.T0, []store.Item{item(lyft, "a", "x", hits)}, out)
		}()
		return ch
	}
	a := run(1)
	<-g.entered // A's pipeline is held
	b := run(3)
	for len(s.q) < 1 {
		runtime.Gosched()
	}
	s.Release()
	if err := <-a; !errors.Is(err, store.ErrReleased) || errors.Is(err, store.ErrNotSent) {
		t.Fatalf("released call in flight: %v, want ErrReleased, sent", err)
	}
	if err := <-b; !errors.Is(err, store.ErrReleased) || !errors.Is(err, store.ErrNotSent) || !errors.Is(err, store.ErrStuck) {
		t.Fatalf("released queued call: %v, want ErrReleased, not sent, stuck", err)
	}
	cc := run(1)
	for len(s.q) < 2 { // B's abandoned request, then C's
		runtime.Gosched()
	}
	close(g.release)
	if err := <-cc; err != nil {
		t.Fatalf("a call made after Release: %v, want answered", err)
	}
	waitLateGrants(t, s, 1)
	it := item(lyft, "a", "x", 1)
	v, err := s.Inspect(context.Background(), storetest.T0, &it)
	if err != nil {
		t.Fatal(err)
	}
	if h := v.Tiers[0].Hits; h != 2 {
		t.Errorf("the pair holds %d hits once A's grant was given back, want 2 (the load's and C's)", h)
	}
}
