package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
)

// Target is what the server resolved a Resource to.
type Target struct {
	// Resource is the resource's key; Domain is the Charon domain.
	Resource, Domain string
}

// Hold is copies of a copy-limited resource held by this client, from
// Reserve or Seize. Close it when done (defer h.Close()): Close releases
// whatever Release and Transfer left. A Hold is safe for concurrent use.
//
// A Hold returned with OK false is a rejection: it holds nothing, and its
// Reply says why. A Hold granted by the client itself (Degraded or Forced)
// holds nothing on a server: Release and Close only count it down.
type Hold struct {
	c        *Client
	s        *session // nil: a local hold
	id       string
	ok       bool
	degraded bool
	forced   bool
	err      error // the server error behind a degraded hold
	target   Target
	groups   []string
	fencing  int64
	attempts int
	waited   time.Duration
	reply    *charonv1.ReserveResponse
	seized   *charonv1.SeizeResponse

	mu     sync.Mutex   // serializes the operations of the hold
	copies atomic.Int64 // written under mu; read at any time
	closed bool

	lostOnce sync.Once
	lost     chan struct{}
	lostMu   sync.Mutex
	lostErr  error

	goneOnce sync.Once
	gone     chan struct{}
}

// ID is the server's hold id; empty for a rejection or a local hold.
func (h *Hold) ID() string { return h.id }

// OK reports whether copies were granted (by the server, or by the client
// when Degraded or Forced).
func (h *Hold) OK() bool { return h.ok }

// Copies is how many copies the hold has now.
func (h *Hold) Copies() int64 {
	return h.copies.Load()
}

// Degraded reports a grant of the minimum by the client because the server
// could not answer (Options.FailOpen); Err says why.
func (h *Hold) Degraded() bool { return h.degraded }

// Forced reports a grant by the kill switch of a server rejection.
func (h *Hold) Forced() bool { return h.forced }

// Err is the server error behind a degraded hold, else why the hold was lost,
// else nil.
func (h *Hold) Err() error {
	if h.err != nil {
		return h.err
	}
	h.lostMu.Lock()
	defer h.lostMu.Unlock()
	return h.lostErr
}

// Target is the resource and Charon domain holding the copies.
func (h *Hold) Target() Target { return h.target }

// Groups are the domain groups the copies count against.
func (h *Hold) Groups() []string { return h.groups }

// FencingToken increases with every grant of the resource.
func (h *Hold) FencingToken() int64 { return h.fencing }

// Attempts is how many attempts Reserve made.
func (h *Hold) Attempts() int { return h.attempts }

// Waited is the time Reserve spent, backoff sleeps included (paper Figure
// 7's res.waited), measured with Options.Now.
func (h *Hold) Waited() time.Duration { return h.waited }

// Reply is the server's reserve answer with the decision context (for a
// Forced hold, the rejection); nil for a seized or degraded hold.
func (h *Hold) Reply() *charonv1.ReserveResponse { return h.reply }

// Seized is the server's seize answer; nil for a reserved hold.
func (h *Hold) Seized() *charonv1.SeizeResponse { return h.seized }

// Lost is closed when the server has dropped the hold because the Session
// stream carrying it ended (client closed, network loss, server crash); Err
// then says why, and operations on the hold fail with ErrSessionLost. It is
// never closed for a local hold or a rejection.
func (h *Hold) Lost() <-chan struct{} { return h.lost }

func (h *Hold) markLost(err error) {
	h.lostOnce.Do(func() {
		h.lostMu.Lock()
		h.lostErr = err
		h.lostMu.Unlock()
		close(h.lost)
	})
}

func (h *Hold) lostError() error {
	select {
	case <-h.lost:
		h.lostMu.Lock()
		defer h.lostMu.Unlock()
		return h.lostErr
	default:
		return nil
	}
}

// Gone is closed once the client has learned that the server no longer has
// the hold while its session lives (ErrHoldGone): another client
// transferred all its copies away, or released them, with the hold's id.
// Check asks; Release, Transfer and Close learn it from their answer.
// Copies is then 0. It is never closed for a local hold or a rejection.
func (h *Hold) Gone() <-chan struct{} { return h.gone }

// markGone records that the server no longer has the hold; h.mu held.
func (h *Hold) markGone() {
	h.goneOnce.Do(func() {
		h.copies.Store(0)
		h.s.untrack(h)
		close(h.gone)
	})
}

// isGone reports whether the client learned the hold is gone.
func (h *Hold) isGone() bool {
	select {
	case <-h.gone:
		return true
	default:
		return false
	}
}

func newHold(c *Client) *Hold {
	return &Hold{c: c, lost: make(chan struct{}), gone: make(chan struct{})}
}

// Reserve asks for between min and copies copies of a copy-limited resource
// (min 0 means 1), retrying rejections for up to maxWait (UseDefault:
// Options.MaxWait) with exponential backoff and jitter. A rejection is not an
// error: the Hold is not OK. If ctx ends first, the error is ctx.Err(). The
// hold lives on the Client's Session stream. A resource far over the
// server's limits is ErrInvalid (see there), never a degraded grant: it is
// not sent, since it would end the stream and every hold on it.
func (c *Client) Reserve(ctx context.Context, r Resource, copies, min int64, maxWait time.Duration) (*Hold, error) {
	return c.ReserveID(ctx, "", r, copies, min, maxWait)
}

// ReserveID is Reserve under a request id (none when empty), which makes
// it idempotent: the server answers a reserve that repeats an id it saw
// with the first answer, marked replayed (Reply().GetReplayed()), and
// grants nothing more; a hold of that answer that is gone since is a
// rejection with Reply().GetHoldGone(). A caller that lost an answer asks
// again under the same id.
func (c *Client) ReserveID(ctx context.Context, requestID string, r Resource, copies, min int64, maxWait time.Duration) (*Hold, error) {
	if copies < 1 || min < 0 || min > copies {
		return nil, fmt.Errorf("%w: copies %d, min %d: want copies >= 1 and 0 <= min <= copies", ErrInvalid, copies, min)
	}
	h := newHold(c)
	req := &charonv1.ReserveRequest{Resource: r.proto(), Copies: copies, MinCopies: min, RequestId: requestID, Lease: durationOrNil(c.opts.Lease)}
	op := &charonv1.SessionRequest_Reserve{Reserve: req}
	// Checked before a stream is opened, so that a server error opening it
	// cannot turn a client error into a degraded grant.
	if err := checkSize(&charonv1.SessionRequest{Operation: op}); err != nil {
		return nil, err
	}
	try := func(ctx context.Context) (outcome, error) {
		ctx, cancel := c.attemptContext(ctx)
		defer cancel()
		s, err := c.session(ctx)
		if err != nil {
			return outcome{}, err
		}
		resp, err := s.call(ctx, &charonv1.SessionRequest{Operation: op})
		if err != nil {
			return outcome{}, err
		}
		reply := resp.GetReserve()
		h.s, h.reply = s, reply
		return outcome{ok: reply.GetOk()}, nil
	}
	tr, err := c.attempt(ctx, maxWait, try)
	if err != nil {
		return nil, err
	}
	h.attempts, h.waited, h.forced = tr.attempts, tr.waited, tr.forced
	if tr.degraded != nil {
		h.s, h.reply = nil, nil
		h.ok, h.degraded, h.err = true, true, tr.degraded
		h.copies.Store(minimum(copies, min))
		return h, nil
	}
	reply := h.reply
	h.target = Target{Resource: reply.GetTarget().GetResource(), Domain: reply.GetTarget().GetDomain()}
	if h.forced {
		h.s = nil
		h.ok = true
		h.copies.Store(copies)
		return h, nil
	}
	if !reply.GetOk() {
		h.s = nil
		return h, nil
	}
	h.ok, h.id = true, reply.GetHoldId()
	h.copies.Store(reply.GetGranted())
	h.groups, h.fencing = reply.GetGroups(), reply.GetFencingToken()
	h.s.track(h)
	return h, nil
}

// Seize claims copies another client staged with Transfer, as a hold of this
// client. It is not retried and never degraded: an unknown, expired or seized
// transfer id is NOT_FOUND.
func (c *Client) Seize(ctx context.Context, transferID string) (*Hold, error) {
	if transferID == "" {
		return nil, fmt.Errorf("%w: empty transfer id", ErrInvalid)
	}
	req := &charonv1.SessionRequest{Operation: &charonv1.SessionRequest_Seize{
		Seize: &charonv1.SeizeRequest{TransferId: transferID, Lease: durationOrNil(c.opts.Lease)},
	}}
	if err := checkSize(req); err != nil {
		return nil, err
	}
	s, err := c.session(ctx)
	if err != nil {
		return nil, err
	}
	resp, err := s.call(ctx, req)
	if err != nil {
		return nil, err
	}
	r := resp.GetSeize()
	h := newHold(c)
	h.s, h.seized, h.ok = s, r, true
	h.id, h.fencing, h.groups = r.GetHoldId(), r.GetFencingToken(), r.GetGroups()
	h.copies.Store(r.GetCopies())
	h.target = Target{Resource: r.GetTarget().GetResource(), Domain: r.GetTarget().GetDomain()}
	s.track(h)
	return h, nil
}

// check returns why an operation on n copies of h cannot go on; h.mu held.
func (h *Hold) check(n int64) error {
	switch {
	case h.closed:
		return ErrHoldClosed
	case n < 1:
		return fmt.Errorf("%w: copies %d: want >= 1", ErrInvalid, n)
	case n > h.copies.Load():
		return fmt.Errorf("%w: %d, the hold has %d", ErrOverRelease, n, h.copies.Load())
	}
	if h.s != nil {
		if err := h.lostError(); err != nil {
			return err
		}
	}
	return nil
}

// Check asks the server whether it still has the hold, changing nothing
// (a keep-alive of the shortest lease, which never shortens one). It
// returns nil while the hold is there, ErrHoldGone (and closes Gone) once
// another client transferred all its copies away or released them with
// the hold's id, ErrSessionLost when the session ended, and ErrHoldClosed
// after Close. A rejection or a local hold is never checked: nil.
func (h *Hold) Check(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.closed:
		return ErrHoldClosed
	case h.s == nil || !h.ok:
		return nil
	case h.isGone():
		return ErrHoldGone
	}
	if err := h.lostError(); err != nil {
		return err
	}
	_, err := h.s.call(ctx, &charonv1.SessionRequest{Operation: &charonv1.SessionRequest_KeepAlive{
		KeepAlive: &charonv1.KeepAliveRequest{Target: &charonv1.KeepAliveRequest_HoldId{HoldId: h.id}, Lease: durationpb.New(probeLease)},
	}})
	return h.opError(err)
}

// probeLease is the lease of Check's keep-alive: the server's shortest.
// A keep-alive never shortens a lease, and the session's renewals keep
// its holds' leases far longer, so it extends nothing.
const probeLease = time.Microsecond

// Release gives back n of the hold's copies (partial releases allowed).
func (h *Hold) Release(ctx context.Context, n int64) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.check(n); err != nil {
		return err
	}
	if h.s == nil {
		h.copies.Add(-n)
		return nil
	}
	if h.isGone() {
		return ErrHoldGone
	}
	resp, err := h.s.call(ctx, &charonv1.SessionRequest{Operation: &charonv1.SessionRequest_Release{
		Release: &charonv1.ReleaseRequest{HoldId: h.id, Copies: n},
	}})
	if err != nil {
		return h.opError(err)
	}
	h.setCopies(resp.GetRelease().GetRemaining())
	return nil
}

// Transfer stages n of the hold's copies for another client to Seize within
// ttl (0: the server's default) and returns the transfer id to hand over.
// Local holds cannot be transferred (ErrLocalHold).
func (h *Hold) Transfer(ctx context.Context, n int64, ttl time.Duration) (string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.check(n); err != nil {
		return "", err
	}
	if h.s == nil {
		return "", ErrLocalHold
	}
	if h.isGone() {
		return "", ErrHoldGone
	}
	resp, err := h.s.call(ctx, &charonv1.SessionRequest{Operation: &charonv1.SessionRequest_Transfer{
		Transfer: &charonv1.TransferRequest{HoldId: h.id, Copies: n, Ttl: durationOrNil(ttl)},
	}})
	if err != nil {
		return "", h.opError(err)
	}
	t := resp.GetTransfer()
	h.setCopies(t.GetRemaining())
	return t.GetTransferId(), nil
}

// Close releases the copies the hold still has, within
// Options.CloseTimeout. It is idempotent, and nil for a rejection, a local
// hold, an empty hold, a lost one (the server already released it), or one
// that is gone on the server (its copies all transferred, or released, by
// another client, with its id): nothing is left to release.
func (h *Hold) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), h.c.opts.CloseTimeout)
	defer cancel()
	_, err := h.ReleaseAll(ctx)
	if errors.Is(err, ErrHoldClosed) || errors.Is(err, ErrHoldGone) || isLost(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("client: close hold: %w", err)
	}
	return nil
}

// ReleaseAll closes the hold, releasing every copy the server has of it,
// and returns how many: fewer than Copies when another client released or
// transferred some of them with the hold's id. A hold gone on the server
// is ErrHoldGone, a lost one ErrSessionLost, a closed one ErrHoldClosed
// (0 released each time); a local hold counts its copies down. The hold
// is closed however the release ends.
func (h *Hold) ReleaseAll(ctx context.Context) (int64, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return 0, ErrHoldClosed
	}
	h.closed = true
	n := h.copies.Load()
	switch {
	case h.s == nil || n == 0:
		h.copies.Store(0)
		return n, nil
	case h.isGone():
		return 0, ErrHoldGone
	}
	if err := h.lostError(); err != nil {
		h.copies.Store(0)
		return 0, err
	}
	resp, err := h.s.call(ctx, &charonv1.SessionRequest{Operation: &charonv1.SessionRequest_Release{
		Release: &charonv1.ReleaseRequest{HoldId: h.id}, // 0: all it has
	}})
	if err = h.opError(err); err != nil {
		h.copies.Store(0)
		h.s.untrack(h)
		return 0, err
	}
	h.setCopies(0)
	return resp.GetRelease().GetReleased(), nil
}

// setCopies records the server's count; h.mu held.
func (h *Hold) setCopies(n int64) {
	h.copies.Store(n)
	if n == 0 {
		h.s.untrack(h)
	}
}

// opError is err, with a lost session or a hold gone on the server
// recorded on the hold; h.mu held. A NotFound answer to an operation
// naming the hold (its id is all the server checks) means it is gone:
// the error wraps both ErrHoldGone and the server's status.
func (h *Hold) opError(err error) error {
	switch {
	case err == nil:
		return nil
	case isLost(err):
		h.markLost(err)
	case status.Code(err) == codes.NotFound:
		h.markGone()
		return fmt.Errorf("%w: %w", ErrHoldGone, err)
	}
	return err
}

// ReserveAll reserves the same number of copies, between min and copies, of
// every resource, in order, pseudo-atomically (paper §3.3, Figure 7): each
// resource is asked for what the previous ones granted, the earlier holds are
// trimmed down to what a later one granted, and on the first rejection or
// error every hold already reserved is released. All the reserves share one
// maxWait (UseDefault: Options.MaxWait). On success the holds have equal
// Copies, one per resource in order; the caller closes them. A rejection
// returns an error wrapping ErrRejected.
//
// A rate-limited resource, if any, must come after: Request it for the holds'
// Copies and Release the extra (see the example).
func (c *Client) ReserveAll(ctx context.Context, rs []Resource, copies, min int64, maxWait time.Duration) ([]*Hold, error) {
	wait := c.maxWait(maxWait)
	holds := make([]*Hold, 0, len(rs))
	undo := func() {
		for _, h := range holds {
			_ = h.Close()
		}
	}
	n := copies
	for i, r := range rs {
		h, err := c.Reserve(ctx, r, n, min, max(wait, 0))
		if err != nil {
			undo()
			return nil, fmt.Errorf("client: reserve %s: %w", r, err)
		}
		wait -= h.Waited()
		if !h.OK() {
			undo()
			return nil, fmt.Errorf("%w: resources[%d] %s: at least %d of %d copies", ErrRejected, i, r, max(min, 1), n)
		}
		holds = append(holds, h)
		got := h.Copies()
		if got < n {
			for j, e := range holds[:i] {
				if err := e.Release(ctx, e.Copies()-got); err != nil {
					undo()
					return nil, fmt.Errorf("client: trim %s: %w", rs[j], err)
				}
			}
			n = got
		}
	}
	return holds, nil
}
