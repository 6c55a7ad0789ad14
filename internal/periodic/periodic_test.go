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

func TestNilLoop(t *testing.T) {
	var l *periodic.Loop
	l.Stop()
}
