package periodic_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/charonlimit/charon/internal/periodic"
)

// TestCallsUntilStop: the function runs again and again, and not once Stop
// has returned. Only an eventual call is awaited, under a generous deadline:
// nothing here asserts how long anything takes.
func TestCallsUntilStop(t *testing.T) {
	var calls atomic.Int64
	l := periodic.Start(time.Millisecond, func() { calls.Add(1) })
	deadline := time.Now().Add(10 * time.Second)
	for calls.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls in 10s", calls.Load())
		}
		time.Sleep(time.Millisecond)
	}
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(l.Stop)
	}
	wg.Wait()
	n := calls.Load()
	time.Sleep(5 * time.Millisecond)
	if got := calls.Load(); got != n {
		t.Errorf("%d calls after Stop", got-n)
	}
	l.Stop()
}

// TestSweep: a sweeper passes its clock's instant, and a sweeper of no
// interval is no loop.
func TestSweep(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	got := make(chan time.Time, 1)
	l := periodic.Sweep(time.Millisecond, func() time.Time { return t0 }, func(now time.Time) {
		select {
		case got <- now:
		default:
		}
	})
	defer l.Stop()
	select {
	case now := <-got:
		if !now.Equal(t0) {
			t.Errorf("swept at %v, want the clock's %v", now, t0)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no sweep in 10s")
	}
	if l := periodic.Sweep(0, nil, func(time.Time) { t.Error("swept without an interval") }); l != nil {
		t.Error("Sweep(0) started a loop")
	}
}

func TestNilLoop(t *testing.T) {
	var l *periodic.Loop
	l.Stop()
}
