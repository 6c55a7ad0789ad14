package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/charonlimit/charon/internal/redisconn"
	"github.com/charonlimit/charon/internal/redistest"
	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/tiers"
)

// TestLateGrantGivenBack: a call that Redis applies after its caller gave
// up (Redis pauses writes past the caller's deadline) is given back when
// its reply comes, so Redis counts no hit the caller was not told of: the
// pair holds none afterwards, and its whole limit is granted.
func TestLateGrantGivenBack(t *testing.T) {
	n := redistest.Single(t)
	s := openStore(t, redisconn.Options{URL: "redis://" + n.Addr()}, Options{Clock: ClockCaller})
	now := time.Now()
	out := make([]tiers.Decision, 1)
	release := lateCall(t, s, now)
	unsettled(t, s, "the late call is in flight")
	release()
	waitLateGrants(t, s, 1)
	it := item(lyft, "r", "late", 1)
	v, err := s.Inspect(context.Background(), now, &it)
	if err != nil {
		t.Fatal(err)
	}
	if h := v.Tiers[0].Hits; h != 0 {
		t.Errorf("the pair holds %d hits after the late grant was given back, want 0", h)
	}
	all := item(lyft, "r", "late", lyft.Tiers[0].Limit)
	if err := s.Decide(context.Background(), now, []store.Item{all}, out); err != nil || !out[0].OK || out[0].Granted != lyft.Tiers[0].Limit {
		t.Errorf("the whole limit after the give-back: %v %+v", err, out[0])
	}
}

// TestCompensationOnlyGivesBackGrants: the refund call of a late reply
// rewrites each item to give back what it was granted, at the instant the
// call used; nothing for a rejection, a locked key, a two-step mode or a
// call holding a refund.
func TestCompensationOnlyGivesBackGrants(t *testing.T) {
	hdr := func(mode int64, flags ...int64) []byte {
		h := f64s(nil, mode, -1, 3_600_000, 1000, int64(len(flags)), int64(len(flags)))
		for i, f := range flags {
			h = f64s(h, int64(i+1), 0, 1, 5, 2, f)
		}
		return withPlan(h)
	}
	reply := func(status, now int64, granted ...int64) string {
		b := f64s(nil, status, now)
		for _, g := range granted {
			b = f64s(b, 1, g, 1, g, g, 0, 10-g, 0, 1000)
		}
		return string(b)
	}
	args := func(h []byte, nk int) []any {
		a := []any{fcallName, funcNameArg, nk}
		for range nk {
			a = append(a, "k")
		}
		return append(a, h, "", "policy")
	}
	got := compensation(args(hdr(modeDecide, 0, 2), 2), reply(statusDone, 1234, 5, 0))
	if got == nil {
		t.Fatal("no compensation for a grant")
	}
	h := got[5].([]byte)
	if now := f64at(h, 1); now != 1234 {
		t.Errorf("refund at %d, want the call's instant 1234", now)
	}
	for i, want := range [][3]int64{{5, 0, 1}, {0, 0, 3}} {
		at := hdrFields + itemFields*i
		if g := [3]int64{f64at(h, at+3), f64at(h, at+4), f64at(h, at+5)}; g != want {
			t.Errorf("item %d: hits, min, flags %v, want %v", i, g, want)
		}
		at = hdrFields + itemFields*2 + planFields*i
		if g := [2]int64{f64at(h, at), f64at(h, at+1)}; g != [2]int64{} {
			t.Errorf("item %d: plan (leader, global leader) %v, want a refund's (0, 0)", i, g)
		}
	}
	for name, c := range map[string][]any{
		"rejected":       compensation(args(hdr(modeDecide, 0), 1), reply(statusDone, 1, 0)),
		"locked":         compensation(args(hdr(modeChecked, 0), 1), reply(1, 1)),
		"two-step":       compensation(args(hdr(3, 0), 1), reply(statusDone, 1, 5)),
		"holds a refund": compensation(args(hdr(modeDecide, 1), 1), reply(statusDone, 1, 5)),
		"short reply":    compensation(args(hdr(modeDecide, 0), 1), reply(statusDone, 1)),
	} {
		if c != nil {
			t.Errorf("%s: compensated", name)
		}
	}
}

// holdRefund is a hook that holds the second pipeline naming a key that
// contains key (the first is the late call itself, the second its refund)
// until release is closed, and signals held when it does.
type holdRefund struct {
	key     string
	seen    atomic.Int32
	held    chan struct{}
	release chan struct{}
}

func (h *holdRefund) hook() *redistest.Hook {
	return &redistest.Hook{Pipeline: func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
		for _, cmd := range cmds {
			if args := cmd.Args(); len(args) > 3 && strings.Contains(fmt.Sprint(args[3]), h.key) {
				if h.seen.Add(1) == 2 {
					close(h.held)
					<-h.release
				}
				break
			}
		}
		return next(ctx, cmds)
	}}
}

// TestRefundOffTheDispatcher: the refund of a late reply takes its own
// round trip, not the dispatcher's: while it is held up, the calls queued
// behind the late one are still sent and answered. A dispatcher that sent
// the refund itself would leave them queued until their deadline.
func TestRefundOffTheDispatcher(t *testing.T) {
	n := redistest.Single(t)
	c := redis.NewClient(&redis.Options{Addr: n.Addr()})
	defer c.Close()
	h := &holdRefund{key: "late", held: make(chan struct{}), release: make(chan struct{})}
	c.AddHook(h.hook())
	s, err := NewWithClient(c, Options{Clock: ClockCaller})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Now()
	out := make([]tiers.Decision, 1)
	lateCall(t, s, now)()
	select {
	case <-h.held:
	case <-time.After(30 * time.Second):
		t.Fatal("the late call's refund was never sent")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	err = s.Decide(ctx, now, []store.Item{item(lyft, "r", "next", 1)}, out)
	cancel()
	if err != nil || !out[0].OK {
		t.Errorf("a call queued while the refund was held up: %v %+v; want it answered", err, out[0])
	}
	unsettled(t, s, "the late call's refund is held")
	if got := s.Replies(); got < 3 {
		t.Errorf("Replies() = %d, want at least 3 (warm-up, the late call, the next one)", got)
	}
	close(h.release)
	waitLateGrants(t, s, 1)
}

// lateCall loads the function, then makes a call of 3 hits on pair
// (r, late) whose caller gives up once the call was sent, its pipeline held
// by a gate: Redis applies it only when the returned release is called, and
// its reply comes after its caller has gone.
func lateCall(t *testing.T, s *Store, now time.Time) (release func()) {
	t.Helper()
	out := make([]tiers.Decision, 1)
	if err := s.Decide(context.Background(), now, []store.Item{item(lyft, "r", "warm", 1)}, out); err != nil || !out[0].OK {
		t.Fatalf("warm-up: %v %+v", err, out[0])
	}
	var g gate
	s.c.AddHook(g.hook())
	g.arm()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- s.Decide(ctx, now, []store.Item{item(lyft, "r", "late", 3)}, make([]tiers.Decision, 1))
	}()
	select {
	case <-g.entered: // sent: its pipeline is held
	case <-time.After(20 * time.Second):
		t.Fatal("the late call was never sent")
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) || errors.Is(err, store.ErrNotSent) {
		t.Fatalf("the late call's caller: %v, want context.Canceled after it was sent", err)
	}
	var once sync.Once
	release = func() { once.Do(func() { close(g.release) }) }
	t.Cleanup(release)
	return release
}

// waitLateGrants waits until s has settled (Settle: the late reply read,
// its refund sent) and wants given late grants given back and none failed.
func waitLateGrants(t *testing.T, s *Store, given uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Settle(ctx); err != nil {
		t.Fatalf("Settle: %v", err)
	}
	if g, failed := s.LateGrants(); g != given || failed != 0 {
		t.Fatalf("late grants given back %d, failed %d once settled; want %d and 0", g, failed, given)
	}
}

// unsettled fails the test when s has nothing pending: Settle with a
// context already done must return its error.
func unsettled(t *testing.T, s *Store, what string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Settle(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Settle while %s: %v, want the context's error (something is pending)", what, err)
	}
}

// TestLateRefundAtClose: a late reply read while the store closes (its
// dispatcher still waiting for its batch) is given back all the same, on a
// client the caller keeps.
func TestLateRefundAtClose(t *testing.T) {
	n := redistest.Single(t)
	c := redis.NewClient(&redis.Options{Addr: n.Addr()})
	defer c.Close()
	s, err := NewWithClient(c, Options{Clock: ClockCaller})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	release := lateCall(t, s, now) // its caller has given up
	closed := make(chan struct{})
	go func() {
		s.Close()
		close(closed)
	}()
	<-s.stop  // Close has begun: the refunder is told to stop
	release() // now the dispatcher reads the late reply
	<-closed
	if given, failed := s.LateGrants(); given != 1 || failed != 0 {
		t.Errorf("after Close: late grants given back %d, failed %d; want 1 and 0", given, failed)
	}
	s2, err := NewWithClient(c, Options{Clock: ClockCaller})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	it := item(lyft, "r", "late", 1)
	v, err := s2.Inspect(context.Background(), now, &it)
	if err != nil {
		t.Fatal(err)
	}
	if h := v.Tiers[0].Hits; h != 0 {
		t.Errorf("the pair holds %d hits of the late call, want 0", h)
	}
}
