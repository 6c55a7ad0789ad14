package redisstore

import (
	"fmt"
	"sync/atomic"

	"github.com/charonlimit/charon/internal/store"
)

// stuckWatch tells a call that was not sent whether it waited behind Redis'
// silence: every dispatcher had a batch in flight, sent before the call was
// queued, for the call's whole wait. Such a call is evidence that Redis does
// not answer (store.ErrStuck), as a sent call's timeout is; a call that
// was not sent while a dispatcher was idle or took a newer batch waited
// for this process (its cores, a long queue), not for Redis.
type stuckWatch struct {
	dispatchers int32         // the store's dispatchers (set once by NewWithClient)
	started     atomic.Uint64 // batches the dispatchers started
	inflight    atomic.Int32  // dispatchers with a batch in flight
	// release is closed by Release (and replaced): the calls waiting
	// then give up. nil until a call or Release makes the first.
	release atomic.Pointer[chan struct{}]
}

// begin and end bracket a dispatcher's batch in flight.
func (w *stuckWatch) begin() {
	// started before inflight: a reader that sees the new inflight sees
	// the new batch too.
	w.started.Add(1)
	w.inflight.Add(1)
}

func (w *stuckWatch) end() { w.inflight.Add(-1) }

// mark is taken when a call starts waiting for a dispatcher.
func (w *stuckWatch) mark() uint64 { return w.started.Load() }

// stuck reports whether, since mark, no dispatcher started a batch and
// every one has had one in flight.
func (w *stuckWatch) stuck(mark uint64) bool {
	return w.dispatchers > 0 && w.inflight.Load() >= w.dispatchers && w.started.Load() == mark
}

// released returns the channel the next Release closes.
func (w *stuckWatch) released() <-chan struct{} {
	for {
		if p := w.release.Load(); p != nil {
			return *p
		}
		ch := make(chan struct{})
		w.release.CompareAndSwap(nil, &ch)
	}
}

// Release makes every call now waiting for a dispatcher, or for the reply
// of a batch in flight, give up at once as if its context had ended, with
// an error wrapping store.ErrReleased (and store.ErrNotSent for those not
// sent): nothing waits for Redis' reply any longer but the dispatcher,
// which still reads it and gives back what a released call was granted
// (Settle waits for that). Calls made afterwards wait as usual. The
// resilient wrapper calls it when its breaker opens, so that the calls in
// flight get the failure mode's answer then, not at their deadlines. A
// store without dispatchers (Options.Pipelines < 0) releases nothing.
func (s *Store) Release() {
	next := make(chan struct{})
	for {
		old := s.stall.release.Load()
		if s.stall.release.CompareAndSwap(old, &next) {
			if old != nil {
				close(*old)
			}
			return
		}
	}
}

// notSent is the error of a call that gave up (cause: its context's error,
// or store.ErrReleased) before a dispatcher sent it; mark is the watch's
// when the call was queued.
func (s *Store) notSent(cause error, mark uint64) error {
	if s.stall.stuck(mark) {
		return fmt.Errorf("redisstore: %w: %w: %w", store.ErrNotSent, store.ErrStuck, cause)
	}
	return fmt.Errorf("redisstore: %w: %w", store.ErrNotSent, cause)
}
