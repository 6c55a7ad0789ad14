package engine

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/tiers"
)

// Pacing (pace: on a descriptor): a ShouldRateLimit request rejected only
// by descriptors that pace, each of whose waits (RetryAfter) is within its
// pace, and whose caller's deadline allows the wait plus PaceMargin, is
// reserved in the store for the instant of its grant (store.Reserver;
// package tiers, reserve.go, says why the limit then holds on the instants
// requests are answered at), held until then and answered OK. A
// reservation the store refuses (another request took the slot in the
// meantime) is tried again at the refusal's wait, a few times, within the
// same bounds; otherwise the request is answered as first decided. At most
// PaceMaxWaiting requests wait at once; a caller that goes away while
// waiting gives its reservation back. charon.v1 Request does not pace: its
// caller asks for copies and gets the context to decide when to retry.

// Defaults of the pacing options.
const (
	DefaultPaceMaxWaiting = 1024
	DefaultPaceMargin     = 5 * time.Millisecond
	// paceTries bounds the reservations tried for one request.
	paceTries = 4
	// giveBackTimeout bounds a give-back, made after the caller left.
	giveBackTimeout = time.Second
)

// PaceStats counts pacing since the Engine was made. Safe for concurrent
// use; the zero value counts nothing yet.
type PaceStats struct {
	waiting   atomic.Int64
	granted   atomic.Uint64
	full      atomic.Uint64
	cancelled atomic.Uint64
	// unreserved and giveBackFailed: store errors a paced request met.
	unreserved     atomic.Uint64
	giveBackFailed atomic.Uint64
}

// Unreserved returns the requests answered OVER_LIMIT, though their wait
// was within their pace, because the store could not reserve their grant
// (it failed, or cannot: keys in several Redis Cluster slots).
func (p *PaceStats) Unreserved() uint64 { return p.unreserved.Load() }

// GiveBackFailed returns the give-backs of cancelled waits the store
// failed: their hits stay counted until their windows pass (never more
// than the limit, fewer grants than it allows).
func (p *PaceStats) GiveBackFailed() uint64 { return p.giveBackFailed.Load() }

// Waiting returns the requests held now.
func (p *PaceStats) Waiting() int64 { return p.waiting.Load() }

// Granted returns the requests granted after a wait.
func (p *PaceStats) Granted() uint64 { return p.granted.Load() }

// Full returns the requests answered OVER_LIMIT, though their wait was
// within their pace, because PaceMaxWaiting requests were already held.
func (p *PaceStats) Full() uint64 { return p.full.Load() }

// Cancelled returns the waits given up by their caller (deadline, cancel),
// whose reservations were given back.
func (p *PaceStats) Cancelled() uint64 { return p.cancelled.Load() }

// Pace returns the Engine's pacing counters.
func (e *Engine) Pace() *PaceStats { return &e.paceStats }

// paceWait returns the wait of a request the first decision rejected that
// pacing may hold: every rejected item (not shadow, not a refund) paces
// and its RetryAfter is within its pace, and the caller's deadline allows
// it; 0 when the request is not to be paced.
func (e *Engine) paceWait(ctx context.Context, now time.Time, sc *scratch) time.Duration {
	if e.paceMax < 0 {
		return 0
	}
	var wait time.Duration
	for i := range sc.items {
		it, d := &sc.items[i], &sc.out[i]
		if it.Refund {
			return 0 // refunds were applied: the request is not decided again
		}
		if d.OK || it.Shadow {
			continue
		}
		if sc.pace[i] <= 0 || d.RetryAfter <= 0 || d.RetryAfter > sc.pace[i] {
			return 0
		}
		wait = max(wait, d.RetryAfter)
	}
	if wait > 0 && !e.paceAllows(ctx, now, wait, sc) {
		return 0
	}
	return wait
}

// paceAllows reports whether a wait is within every rejected item's pace
// and leaves PaceMargin before the caller's deadline.
func (e *Engine) paceAllows(ctx context.Context, now time.Time, wait time.Duration, sc *scratch) bool {
	for i := range sc.items {
		if !sc.items[i].Shadow && sc.pace[i] > 0 && wait > sc.pace[i] {
			return false
		}
	}
	if dl, ok := ctx.Deadline(); ok {
		// The wait runs from now on the Engine's clock; the deadline is
		// the caller's, on the wall clock.
		left := time.Until(dl) - e.now().Sub(now)
		if wait+e.paceMargin > left {
			return false
		}
	}
	return true
}

// pace reserves sc's items for now+wait, holds the request until then and
// writes the reservation's decisions to sc.out; it returns the instant of
// the grant on the store's clock (Reserver.Reserve's). It reports false,
// with sc.out unchanged, when the request is not held (no Reserver, too
// many waiting, the store refused); an error when the caller went away
// while waiting (the reservation given back) or the store failed.
func (e *Engine) pace(ctx context.Context, now time.Time, wait time.Duration, sc *scratch) (time.Time, bool, error) {
	rs, ok := e.store.(store.Reserver)
	if !ok {
		return time.Time{}, false, nil
	}
	if e.paceStats.waiting.Add(1) > int64(e.paceMax) {
		e.paceStats.waiting.Add(-1)
		e.paceStats.full.Add(1)
		return time.Time{}, false, nil
	}
	defer e.paceStats.waiting.Add(-1)
	out := sc.paceOut[:0]
	out = grow(out, len(sc.items))
	sc.paceOut = out
	var at time.Time
	for try := 0; ; try++ {
		var err error
		at, err = rs.Reserve(ctx, now, wait, sc.items, out)
		if err != nil {
			// Not reserved (a store that cannot, or failed): answered as
			// first decided, and counted.
			e.paceStats.unreserved.Add(1)
			return time.Time{}, false, nil
		}
		next, granted := time.Duration(0), true
		for i := range sc.items {
			if !out[i].OK && !sc.items[i].Shadow {
				granted = false
				if out[i].RetryAfter == tiers.Unbounded {
					return time.Time{}, false, nil
				}
				next = max(next, out[i].RetryAfter)
			}
		}
		if granted {
			break
		}
		if try+1 == paceTries || next <= 0 || !e.paceAllows(ctx, now, wait+next, sc) {
			return time.Time{}, false, nil
		}
		wait += next
	}
	// The hold runs wait from the reservation's reply, not from now: a
	// store on its own clock (Redis TIME) reserved at its instant of the
	// call plus wait, which came after now by the calls' latency, and an
	// answer released at now+wait came before the grant's instant by that
	// much (a paced request answered a few ms before the window let it).
	// Released late by a reply's latency, never early.
	if err := e.sleep(ctx, wait); err != nil {
		e.paceStats.cancelled.Add(1)
		e.giveBack(ctx, at, sc.items, out)
		return time.Time{}, false, err
	}
	copy(sc.out, out)
	e.paceStats.granted.Add(1)
	return at, true, nil
}

// giveBack gives back the hits the reservation for at granted (a caller
// that stopped waiting), in the background of the caller's context.
func (e *Engine) giveBack(ctx context.Context, at time.Time, items []store.Item, out []tiers.Decision) {
	back := store.Reserved(items, out)
	if len(back) == 0 {
		return
	}
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), giveBackTimeout)
	defer cancel()
	// A failed give-back leaves the slot taken until it passes: never more
	// than the limit, and counted.
	if err := e.store.(store.Reserver).GiveBack(gctx, e.now(), at, back); err != nil {
		e.paceStats.giveBackFailed.Add(1)
	}
}

// sleepCtx waits d on the wall clock, or until ctx ends (its error): the
// default Options.Sleep.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
