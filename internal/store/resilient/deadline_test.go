package resilient_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/resilient"
	"github.com/charonlimit/charon/tiers"
)

// TestRemoteDeadline: a caller with a deadline has the remote wait until
// the margin before it (the larger of Margin and MarginShare of the time
// left), whatever Timeout says; a caller without one gets Timeout.
func TestRemoteDeadline(t *testing.T) {
	f := newFake()
	f.set(answer)
	s := resilient.New(f, resilient.Options{Timeout: 10 * time.Millisecond, Margin: 3 * time.Millisecond, MarginShare: -1})
	defer s.Close()
	deadline := time.Now().Add(time.Hour)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	out := make([]tiers.Decision, 1)
	if err := s.Decide(ctx, t0, []store.Item{take(simple, "a", 1)}, out); err != nil || !out[0].OK {
		t.Fatalf("Decide: %v, %+v", err, out[0])
	}
	if got, want := time.Unix(0, f.deadline.Load()), deadline.Add(-3*time.Millisecond); !got.Equal(want) {
		t.Errorf("remote deadline %v, want the caller's less the margin, %v", got, want)
	}
	// With the default share, a quarter of the time left.
	f4 := newFake()
	f4.set(answer)
	s4 := resilient.New(f4, resilient.Options{})
	defer s4.Close()
	t1 := time.Now()
	if err := s4.Decide(ctx, t0, []store.Item{take(simple, "a", 1)}, out); err != nil {
		t.Fatal(err)
	}
	t2 := time.Now()
	got4 := time.Unix(0, f4.deadline.Load())
	if lo, hi := deadline.Add(-deadline.Sub(t1)/4), deadline.Add(-deadline.Sub(t2)/4); got4.Before(lo.Add(-time.Microsecond)) || got4.After(hi.Add(time.Microsecond)) {
		t.Errorf("remote deadline %v, want a quarter of the time left before the caller's, in [%v, %v]", got4, lo, hi)
	}
	before := time.Now()
	if err := s.Decide(context.Background(), t0, []store.Item{take(simple, "a", 1)}, out); err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	got := time.Unix(0, f.deadline.Load())
	if got.Before(before.Add(10*time.Millisecond)) || got.After(after.Add(10*time.Millisecond)) {
		t.Errorf("remote deadline %v without a caller's deadline, want Timeout (10ms) after the call [%v, %v]", got, before, after)
	}
	// Little time left: the margin is kept whole.
	deadline = time.Now().Add(4 * time.Millisecond)
	ctx2, cancel2 := context.WithDeadline(context.Background(), deadline)
	defer cancel2()
	_ = s.Decide(ctx2, t0, []store.Item{take(simple, "b", 1)}, out)
	if got, want := time.Unix(0, f.deadline.Load()), deadline.Add(-3*time.Millisecond); !got.Equal(want) {
		t.Errorf("remote deadline %v, want the caller's less the whole margin, %v", got, want)
	}
}

// TestSlowIsNotDown: a call that times out while the remote answered
// another call is slow, not evidence of an outage: the breaker (threshold 1)
// stays closed. A timeout while nothing came back opens it.
func TestSlowIsNotDown(t *testing.T) {
	f := newFake()
	s := resilient.New(f, resilient.Options{FailureThreshold: 1, FailureRate: -1, CacheSize: -1})
	defer s.Close()
	f.set(gate)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	out1 := make([]tiers.Decision, 1)
	go func() { done <- s.Decide(ctx, t0, []store.Item{take(simple, "a", 1)}, out1) }()
	<-f.entered // the first call waits on the remote, until its deadline
	f.set(answer)
	out := make([]tiers.Decision, 1)
	if err := s.Decide(context.Background(), t0, []store.Item{take(simple, "b", 1)}, out); err != nil || !out[0].OK {
		t.Fatalf("second call: %v, %+v", err, out[0])
	}
	if err := <-done; err != nil || !out1[0].OK {
		t.Fatalf("slow call in ModeLocal: %v, %+v; want a local grant", err, out1[0])
	}
	st := s.Stats()
	if st.Breaker != resilient.BreakerClosed || st.Slow != 1 || st.Timeouts != 1 || st.Local != 1 {
		t.Errorf("after a slow call: %+v; want the breaker closed, 1 slow timeout, 1 local answer", st)
	}

	f.set(hang)
	ctx3, cancel3 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel3()
	_ = s.Decide(ctx3, t0, []store.Item{take(simple, "c", 1)}, out)
	if st := s.Stats(); st.Breaker != resilient.BreakerOpen || st.Slow != 1 || st.Timeouts != 2 {
		t.Errorf("after a timeout with no answer: %+v; want the breaker open", st)
	}
}

// TestNotSentIsNotAFailure: a call whose deadline passed in the remote's
// own queue goes to the failure mode, counted as NotSent, and leaves the
// breaker alone.
func TestNotSentIsNotAFailure(t *testing.T) {
	f := newFake()
	f.set(notSent)
	s := resilient.New(f, resilient.Options{Mode: resilient.ModeUnavailable, FailureThreshold: 1, FailureRate: -1})
	defer s.Close()
	out := make([]tiers.Decision, 1)
	err := s.Decide(context.Background(), t0, []store.Item{take(simple, "a", 1)}, out)
	if !errors.Is(err, resilient.ErrUnavailable) || !errors.Is(err, store.ErrNotSent) {
		t.Errorf("Decide: %v; want ErrUnavailable wrapping ErrNotSent", err)
	}
	if st := s.Stats(); st.Breaker != resilient.BreakerClosed || st.NotSent != 1 || st.RemoteErrors != 0 || st.Unavailable != 1 {
		t.Errorf("stats %+v; want the breaker closed, 1 not sent, no remote error", st)
	}
}

// TestStuckIsAFailure: a call not sent because it waited behind calls the
// remote has not answered (store.ErrStuck) counts as a timeout: with no
// answer meanwhile toward the breaker, which opens at the threshold; with
// an answer meanwhile as slow. Either way it is counted as not sent.
func TestStuckIsAFailure(t *testing.T) {
	f := &replier{fakeRemote: newFake()}
	f.set(stuck)
	s := resilient.New(f, resilient.Options{Mode: resilient.ModeUnavailable, FailureThreshold: 2, FailureRate: -1, CacheSize: -1})
	defer s.Close()
	out := make([]tiers.Decision, 1)
	err := s.Decide(context.Background(), t0, []store.Item{take(simple, "a", 1)}, out)
	if !errors.Is(err, resilient.ErrUnavailable) || !errors.Is(err, store.ErrStuck) {
		t.Errorf("Decide: %v; want ErrUnavailable wrapping ErrStuck", err)
	}
	if st := s.Stats(); st.Breaker != resilient.BreakerClosed || st.NotSent != 1 || st.Stuck != 1 || st.Timeouts != 1 || st.RemoteErrors != 1 {
		t.Errorf("after one stuck call: %+v; want it counted as not sent, stuck and a timeout, the breaker closed (threshold 2)", st)
	}
	// The remote answers another call meanwhile: a stuck call is slow.
	f2 := &replierAt{replier: &replier{fakeRemote: newFake()}}
	f2.set(stuck)
	s2 := resilient.New(f2, resilient.Options{Mode: resilient.ModeUnavailable, FailureThreshold: 1, FailureRate: -1, CacheSize: -1})
	defer s2.Close()
	_ = s2.Decide(context.Background(), t0, []store.Item{take(simple, "b", 1)}, out)
	if st := s2.Stats(); st.Breaker != resilient.BreakerClosed || st.Stuck != 1 || st.Slow != 1 {
		t.Errorf("a stuck call while the remote answered another: %+v; want it slow, the breaker closed (threshold 1)", st)
	}
	// No answer: the second stuck call opens the breaker; the next call
	// does not reach the remote.
	_ = s.Decide(context.Background(), t0, []store.Item{take(simple, "c", 1)}, out)
	calls := f.calls.Load()
	_ = s.Decide(context.Background(), t0, []store.Item{take(simple, "d", 1)}, out)
	if st := s.Stats(); st.Breaker != resilient.BreakerOpen || st.BreakerOpens != 1 || st.Stuck != 2 || st.NotSent != 2 || st.Unavailable != 3 || f.calls.Load() != calls {
		t.Errorf("after two stuck calls and another: %+v, remote calls %d then %d; want the breaker open after the second, the third not sent to the remote", st, calls, f.calls.Load())
	}
}

// replierAt is a replier whose replies grow at every call, as if the
// remote answered another caller while this one waited.
type replierAt struct{ *replier }

func (r *replierAt) Decide(ctx context.Context, now time.Time, items []store.Item, out []tiers.Decision) error {
	r.replies.Add(1)
	return r.replier.Decide(ctx, now, items, out)
}

// replier is a fake remote that counts replies its callers did not see,
// as the Redis store's dispatchers do for late replies.
type replier struct {
	*fakeRemote
	replies atomic.Uint64
}

func (r *replier) Replies() uint64 { return r.replies.Load() }

// TestLateRepliesAreAnswers: a call that times out while the remote's
// replies grew (a reply that came after its own caller's deadline, read by
// the remote) was slow, not a sign of an outage: with a threshold of one
// failure the breaker stays closed. With no reply meanwhile it opens.
func TestLateRepliesAreAnswers(t *testing.T) {
	f := &replier{fakeRemote: newFake()}
	s := resilient.New(f, resilient.Options{FailureThreshold: 1, FailureRate: -1, CacheSize: -1})
	defer s.Close()
	f.set(hang)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	done := make(chan error, 1)
	out := make([]tiers.Decision, 1)
	go func() { done <- s.Decide(ctx, t0, []store.Item{take(simple, "a", 1)}, out) }()
	for f.calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	f.replies.Add(1) // another caller's late reply, read by the remote
	if err := <-done; err != nil || !out[0].OK {
		t.Fatalf("timed-out call in ModeLocal: %v, %+v; want a local grant", err, out[0])
	}
	if st := s.Stats(); st.Breaker != resilient.BreakerClosed || st.Slow != 1 || st.Timeouts != 1 {
		t.Errorf("after a timeout while a late reply came: %+v; want the breaker closed, 1 slow timeout", st)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	_ = s.Decide(ctx2, t0, []store.Item{take(simple, "b", 1)}, out)
	if st := s.Stats(); st.Breaker != resilient.BreakerOpen || st.Slow != 1 || st.Timeouts != 2 {
		t.Errorf("after a timeout with no reply at all: %+v; want the breaker open", st)
	}
}
