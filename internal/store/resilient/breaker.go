package resilient

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// BreakerState is the state of the circuit breaker in front of the remote.
type BreakerState int32

// Breaker states.
const (
	// BreakerClosed: the remote is called.
	BreakerClosed BreakerState = iota
	// BreakerOpen: the remote is not called; Probe pings it once the
	// cool-off is over, and a ping that succeeds closes the breaker.
	BreakerOpen
)

// String returns "closed" or "open".
func (s BreakerState) String() string {
	switch s {
	case BreakerClosed:
		return "closed"
	case BreakerOpen:
		return "open"
	}
	return fmt.Sprintf("BreakerState(%d)", int32(s))
}

// breaker is a circuit breaker over nanosecond instants passed by the caller.
// The closed path (success) is lock-free; transitions take mu, so they are
// ordered and onChange sees them in order.
type breaker struct {
	name      string  // the shard's (Sharder), "" for the whole remote
	threshold int64   // consecutive failures that open it
	rate      float64 // failure ratio that opens it; 0: off
	minCalls  int64   // calls in the window before the ratio counts
	window    int64   // ns, the ratio's window
	cooloff   int64   // ns
	onChange  func(BreakerState)

	state       atomic.Int32
	openUntil   atomic.Int64 // ns: the end of the cool-off, when probes may go
	consecutive atomic.Int64
	winStart    atomic.Int64
	winCalls    atomic.Int64
	winFails    atomic.Int64
	opens       atomic.Uint64
	failures    atomic.Uint64 // counted failures
	// answers counts the calls of its part that the remote answered
	// through the wrapper: a timeout while it grew was slowness, not an
	// outage.
	answers atomic.Uint64
	probing atomic.Int32 // Probe's pings in flight

	mu sync.Mutex
}

// MaxProbes is how many of Probe's pings of one breaker may be in flight at
// once. A ping lost in a black hole waits for its ProbeTimeout; the next
// ones, started meanwhile by the owner's calls of Probe, find the remote as
// soon as it is back instead of after that ping's timeout.
const MaxProbes = 3

// startProbe reserves a ping in flight, false when MaxProbes are; endProbe
// gives it back.
func (b *breaker) startProbe() bool {
	if b.probing.Add(1) > MaxProbes {
		b.probing.Add(-1)
		return false
	}
	return true
}

func (b *breaker) endProbe() { b.probing.Add(-1) }

// closed reports whether calls may go to the remote.
func (b *breaker) closed() bool { return BreakerState(b.state.Load()) == BreakerClosed }

// success records a remote call that answered.
func (b *breaker) success(now int64) {
	if b.consecutive.Load() != 0 {
		b.consecutive.Store(0)
	}
	b.count(now, false)
}

// failure records a remote call that failed, opening the breaker when the
// consecutive failures or the failure rate say so. A failure while the
// breaker is open (a call that was in flight when it opened) is not
// counted: it is evidence of the outage the breaker already knows of, and
// counted it would reopen the breaker at the first failure after a probe
// closes it. It reports whether this failure opened the breaker.
func (b *breaker) failure(now int64) (opened bool) {
	if !b.closed() {
		return false
	}
	b.failures.Add(1)
	n := b.consecutive.Add(1)
	calls, fails := b.count(now, true)
	if n >= b.threshold || (b.rate > 0 && calls >= b.minCalls && float64(fails) >= b.rate*float64(calls)) {
		b.mu.Lock()
		if BreakerState(b.state.Load()) == BreakerClosed {
			b.openUntil.Store(now + b.cooloff)
			b.consecutive.Store(0)
			b.resetWindow(now)
			b.opens.Add(1)
			b.set(BreakerOpen)
			opened = true
		}
		b.mu.Unlock()
	}
	return opened
}

// close closes the breaker after a successful probe at now.
func (b *breaker) close(now int64) {
	b.mu.Lock()
	b.consecutive.Store(0)
	b.resetWindow(now)
	b.set(BreakerClosed)
	b.mu.Unlock()
}

// set changes the state and tells onChange; mu is held.
func (b *breaker) set(s BreakerState) {
	if BreakerState(b.state.Swap(int32(s))) != s && b.onChange != nil {
		b.onChange(s)
	}
}

func (b *breaker) resetWindow(now int64) {
	b.winStart.Store(now)
	b.winCalls.Store(0)
	b.winFails.Store(0)
}

// count adds a call to the failure-rate window, starting a new window when
// the current one is over, and returns the window's calls and failures.
// Concurrent calls at a window's turn may be counted in either window.
func (b *breaker) count(now int64, failed bool) (calls, fails int64) {
	if b.rate <= 0 {
		return 0, 0
	}
	if ws := b.winStart.Load(); now-ws >= b.window || now < ws {
		if b.winStart.CompareAndSwap(ws, now) {
			b.winCalls.Store(0)
			b.winFails.Store(0)
		}
	}
	calls = b.winCalls.Add(1)
	if failed {
		fails = b.winFails.Add(1)
	} else {
		fails = b.winFails.Load()
	}
	return calls, fails
}

// retryIn returns the time until the cool-off ends, in ns, or 0 when the
// breaker is not open or the cool-off is over.
func (b *breaker) retryIn(now int64) int64 {
	if BreakerState(b.state.Load()) != BreakerOpen {
		return 0
	}
	return max(b.openUntil.Load()-now, 0)
}
