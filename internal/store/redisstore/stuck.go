package redisstore

import (
	"context"
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

// notSent is the error of a call whose context ended before a dispatcher
// sent it; mark is the watch's when the call was queued.
func (s *Store) notSent(ctx context.Context, mark uint64) error {
	if s.stall.stuck(mark) {
		return fmt.Errorf("redisstore: %w: %w: %w", store.ErrNotSent, store.ErrStuck, ctx.Err())
	}
	return fmt.Errorf("redisstore: %w: %w", store.ErrNotSent, ctx.Err())
}
