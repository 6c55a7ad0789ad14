// Package client is the Go client of the charon.v1 API (paper §3.2): rate
// requests and copy reservations that wait for a grant, holds released by
// Close, transfers between processes, a fail-open degraded mode and a kill
// switch.
//
// # Waiting
//
// Request and Reserve take a maxWait. A rejection is retried with exponential
// backoff: after the i-th rejection (from 0) the client sleeps
//
//	min(maxWait − elapsed, jitter(2^i × BackoffBase))
//
// where elapsed is measured with Options.Now, 2^i × BackoffBase is capped at
// BackoffCap, and jitter draws uniformly in [v − v/4, v + v/4). Once the
// sleep would be ≤ 0, the last rejection is returned; a rejection marked
// retry_never is returned at once. The server's retry_after only lengthens a
// sleep when Options.HonorRetryAfter is set: the paper's formula is the
// default contract. A maxWait of 0 (the default) tries once.
//
// # Degraded mode and kill switch
//
// With Options.FailOpen, a Request or Reserve the server cannot answer
// (unreachable, UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL, ...; see
// ServerError) is granted by the client for the minimum — max(min, 1), at
// most copies — and marked Degraded, without retrying (the paper: do not
// re-issue a request to a failing server). Client errors (INVALID_ARGUMENT,
// NOT_FOUND, FAILED_PRECONDITION, OUT_OF_RANGE, ...) and the caller's own
// cancellation are always returned. The kill switch (SetKillSwitch, atomic,
// changeable at any time) answers every server rejection with a grant of all
// the copies asked, marked Forced, without waiting. Degraded and forced holds
// exist only in the client: Release and Close count them down locally and
// Transfer refuses them.
//
// # Holds and sessions
//
// Holds live on one Session stream per Client, opened at the first Reserve
// or Seize; every operation on it carries a correlation id, so calls from
// many goroutines share it. The server releases a session's holds when the
// stream ends, which is how a crashed client gives its copies back. When the
// stream breaks, the client closes the Lost channel of every hold it carried
// and further operations on them fail with ErrSessionLost; the next Reserve
// opens a new stream. A reserve whose caller gave up (context canceled) but
// was granted anyway is released as soon as its answer arrives. Close a hold
// when done, typically with defer: Close releases what Release and Transfer
// left, and is idempotent. Client.Close ends the stream, releasing every hold.
//
// Another client may transfer or release a hold's copies with its id (the
// copy verbs of the charon command do): once all are gone the server no
// longer has the hold, though its session lives. Hold.Check asks, and
// Release, Transfer and Close learn it from their answer: the Gone channel
// is closed and operations fail with ErrHoldGone; Close has nothing to
// release and returns nil. ReleaseAll releases what the server still has
// and says how many.
//
// The client keeps holds alive with the stream rather than with unary calls
// and KeepAlive leases, because that is the paper's model (holds die with
// their session) and needs no timer in the client: the server renews the
// session's leases while the stream lives and releases the holds when it
// ends. A connection that dies silently is noticed by gRPC keepalive pings:
// Dial turns them on (every 20s); a caller of New configures its own
// connection. Options.CallTimeout bounds each attempt, so a server that
// hangs counts as a server error.
//
// Every call on the stream, and Client.Close, ends by its context even when
// the server stops reading (it hangs, or gRPC flow control is full): one
// goroutine writes to the stream, callers hand it their operations with a
// select on their context, and an operation whose caller gave up before its
// turn is not sent. Client.Close cancels the stream rather than wait for the
// server. A request over 64 KiB encoded (the server's limits on domains,
// keys and values keep any valid one under 34 KB) is refused with
// ErrInvalid before anything is sent: sent, it would end the stream and
// every hold on it.
//
// # Examples
//
// Wait up to 5 seconds for one hit of a rate-limited resource (paper
// Figure 4):
//
//	res, err := c.Request(ctx, client.R("api", "user", "alice"), 1, 1, 5*time.Second)
//	if err != nil {
//		return err
//	}
//	if !res.OK {
//		return errOverLimit
//	}
//	handleAPICall()
//
// Hold copies while a block runs, released however it ends (Figure 5):
//
//	h, err := c.Reserve(ctx, client.R("db", "tenant", "acme"), 15, 1, 0)
//	if err != nil {
//		return err
//	}
//	defer h.Close()
//	if h.OK() {
//		useConnections(h.Copies())
//	}
//
// Hand copies to another process (Figure 6):
//
//	// Process 1
//	h, err := c.Reserve(ctx, r, 15, 15, 0)
//	...
//	defer h.Close()
//	step1()                                   // has 15 copies
//	tid, err := h.Transfer(ctx, 10, 30*time.Second) // stage 10 copies
//	send(tid)                                 // to process 2
//	step2()                                   // has 5 copies
//
//	// Process 2
//	h, err := c.Seize(ctx, recv())
//	...
//	defer h.Close()
//	step3()                                   // has 10 copies
//	err = h.Release(ctx, 5)                   // release 5 copies
//	step4()                                   // has 5 copies
//
// Copies and a rate-limited resource pseudo-atomically (Figure 7): reserve
// first, request only as many hits as copies were granted, within what is
// left of the wait, and release the extra copies.
//
//	hc, err := c.Reserve(ctx, resC, n, 1, maxWait)
//	...
//	defer hc.Close()
//	if hc.OK() {
//		rr, err := c.Request(ctx, resR, hc.Copies(), 1, maxWait-hc.Waited())
//		...
//		if rr.OK {
//			if extra := hc.Copies() - rr.Granted; extra > 0 {
//				_ = hc.Release(ctx, extra)
//			}
//			process(rr.Granted)
//		}
//	}
//
// ReserveAll does the same for several copy-limited resources, releasing
// everything on the first rejection.
//
// A Client is safe for concurrent use; so is a Hold. The zero Options are
// usable: no waiting, errors returned, kill switch off, the real clock.
package client
