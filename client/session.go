package client

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
)

// session is one Session stream: calls are sent with a correlation id and
// answered, in any order, by the reader goroutine. The holds reserved or
// seized on it die with it.
//
// The writer goroutine is the stream's only sender (gRPC allows one at a
// time). A Send blocks while gRPC flow control is full, which lasts as long
// as the server is not reading (it is slow, hung, or running an operation),
// and only the stream's context ends it; so callers hand their requests to
// the writer with a select on their own context, and are never stuck behind
// a blocked Send.
type session struct {
	stream charonv1.Charon_SessionClient
	cancel context.CancelFunc

	calls     chan *charonv1.SessionRequest // to the writer; unbuffered
	wake      chan struct{}                 // tells the writer orphans are queued
	closeSend chan struct{}                 // asks an idle writer to half-close
	written   chan struct{}                 // closed when the writer has returned

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]chan *charonv1.SessionResponse
	orphans []string // holds to release that nobody waits for, for the writer
	holds   map[*Hold]struct{}
	closing bool
	err     error         // why it ended; set before done is closed
	done    chan struct{} // closed when the stream has ended
}

// newSession returns a session of stream; the caller starts its reader and
// writer. cancel ends stream.
func newSession(stream charonv1.Charon_SessionClient, cancel context.CancelFunc) *session {
	return &session{
		stream:    stream,
		cancel:    cancel,
		calls:     make(chan *charonv1.SessionRequest),
		wake:      make(chan struct{}, 1),
		closeSend: make(chan struct{}),
		written:   make(chan struct{}),
		pending:   make(map[uint64]chan *charonv1.SessionResponse),
		holds:     make(map[*Hold]struct{}),
		done:      make(chan struct{}),
	}
}

// session returns the live Session stream, opening one if there is none or
// the last one ended. The stream outlives ctx, but opening it (which waits
// for a connection) gives up when ctx ends.
func (c *Client) session(ctx context.Context) (*session, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	if s := c.sess; s != nil {
		select {
		case <-s.done:
		default:
			return s, nil
		}
	}
	sctx, cancel := context.WithCancel(context.Background())
	stop := context.AfterFunc(ctx, cancel)
	stream, err := c.rpc.Session(sctx)
	if !stop() {
		cancel()
		return nil, ctx.Err()
	}
	if err != nil {
		cancel()
		return nil, err
	}
	s := newSession(stream, cancel)
	c.sess = s
	go s.read()
	go s.write()
	return s, nil
}

// call sends req and waits for its answer. An Error answer becomes the status
// error a unary call would have returned. If ctx ends first, the error is
// ctx.Err() and the call is abandoned: if it was not sent yet, it never is;
// a hold granted to it later is released by the reader. A request over
// maxRequestSize is refused (ErrInvalid) and nothing is sent.
func (s *session) call(ctx context.Context, req *charonv1.SessionRequest) (*charonv1.SessionResponse, error) {
	if err := checkSize(req); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ch := make(chan *charonv1.SessionResponse, 1)
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return nil, s.err
	}
	s.nextID++
	req.Id = s.nextID
	s.pending[req.Id] = ch
	s.mu.Unlock()

	select {
	case s.calls <- req:
	case <-s.done:
		return nil, s.err
	case <-ctx.Done():
		s.abandon(req.Id, ch)
		return nil, ctx.Err()
	}
	// If the writer's Send fails, the stream is broken and the reader ends
	// the session with the reason Recv gives.
	select {
	case r := <-ch:
		return answer(r)
	case <-s.done:
		select {
		case r := <-ch:
			return answer(r)
		default:
			return nil, s.err
		}
	case <-ctx.Done():
		s.abandon(req.Id, ch)
		return nil, ctx.Err()
	}
}

func answer(r *charonv1.SessionResponse) (*charonv1.SessionResponse, error) {
	if e, ok := r.GetResult().(*charonv1.SessionResponse_Error); ok {
		return nil, status.Error(codes.Code(e.Error.GetCode()), e.Error.GetMessage())
	}
	return r, nil
}

// write sends what callers hand over and the releases of orphans, until the
// session ends or close asks it to half-close the stream. A call whose caller
// gave up before its turn is not sent, so that nothing is reserved for
// nobody; an orphan's release, which nobody waits for, always is. Send errors
// are left to the reader: a failed Send ends the stream, and Recv says why.
func (s *session) write() {
	defer close(s.written)
	for {
		for _, id := range s.takeOrphans() {
			_ = s.stream.Send(s.orphanRelease(id))
		}
		select {
		case req := <-s.calls:
			if s.waiting(req.GetId()) {
				_ = s.stream.Send(req)
			}
		case <-s.wake:
		case <-s.closeSend:
			_ = s.stream.CloseSend()
			return
		case <-s.done:
			return
		}
	}
}

// waiting reports whether call id's caller still waits for its answer.
func (s *session) waiting(id uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.pending[id]
	return ok
}

// abandon gives up on call id, whose caller's context ended. If the reader
// took the answer off pending in the meantime, it is in ch (buffered) and
// nobody will read it: a hold it grants is released like any other orphan.
func (s *session) abandon(id uint64, ch chan *charonv1.SessionResponse) {
	s.mu.Lock()
	_, waiting := s.pending[id]
	delete(s.pending, id)
	s.mu.Unlock()
	if waiting {
		return
	}
	select {
	case r := <-ch:
		s.orphan(r)
	default:
		// The stream ended with the call unanswered (end clears pending):
		// its holds died with it.
	}
}

// orphan handles an answer nobody waits for: a caller gave up. It gives back
// what the answer granted rather than hold it until the session ends.
func (s *session) orphan(r *charonv1.SessionResponse) {
	if id := grantedHold(r); id != "" {
		s.releaseOrphan(id)
	}
}

// read dispatches answers until the stream ends, then ends the session.
func (s *session) read() {
	for {
		r, err := s.stream.Recv()
		if err != nil {
			s.end(err)
			return
		}
		// The answer goes into ch under mu (ch is buffered: it never
		// blocks), so abandon finds it either pending or in ch.
		s.mu.Lock()
		ch, ok := s.pending[r.GetId()]
		if ok {
			delete(s.pending, r.GetId())
			ch <- r
		}
		s.mu.Unlock()
		if !ok {
			s.orphan(r)
		}
	}
}

func grantedHold(r *charonv1.SessionResponse) string {
	switch x := r.GetResult().(type) {
	case *charonv1.SessionResponse_Reserve:
		if x.Reserve.GetOk() && !x.Reserve.GetReplayed() {
			return x.Reserve.GetHoldId()
		}
	case *charonv1.SessionResponse_Seize:
		return x.Seize.GetHoldId()
	}
	return ""
}

// releaseOrphan queues the release of hold holdID for the writer; it never
// blocks, since the reader calls it.
func (s *session) releaseOrphan(holdID string) {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return // the hold died with the session
	}
	s.orphans = append(s.orphans, holdID)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default: // the writer is already told
	}
}

func (s *session) takeOrphans() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := s.orphans
	s.orphans = nil
	return ids
}

// orphanRelease is the release of an orphan's hold, with an id of its own
// and no pending entry: the reader drops its answer.
func (s *session) orphanRelease(holdID string) *charonv1.SessionRequest {
	s.mu.Lock()
	s.nextID++
	id := s.nextID
	s.mu.Unlock()
	return &charonv1.SessionRequest{Id: id, Operation: &charonv1.SessionRequest_Release{
		Release: &charonv1.ReleaseRequest{HoldId: holdID},
	}}
}

// end records why the stream ended, wakes every waiting call and marks every
// hold of the session lost.
func (s *session) end(cause error) {
	s.mu.Lock()
	if s.closing {
		s.err = fmt.Errorf("%w: %w", ErrSessionLost, ErrClosed)
	} else {
		s.err = fmt.Errorf("%w: %w", ErrSessionLost, cause)
	}
	holds := s.holds
	s.holds = nil
	s.pending = nil
	s.orphans = nil
	s.mu.Unlock()
	s.cancel()
	close(s.done)
	for h := range holds {
		h.markLost(s.err)
	}
}

// close ends the stream from this side and waits for the reader and the
// writer to finish. It never waits for the server: when the writer is idle it
// half-closes the stream first (the server sees the client end it), but a
// Send under way may never finish if the server stopped reading, so then the
// stream is only canceled, which ends that Send.
func (s *session) close() {
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	select {
	case s.closeSend <- struct{}{}:
		<-s.written
	default:
	}
	s.cancel()
	<-s.done
	<-s.written
}

// track adds h to the holds that die with the session; it reports false
// (and marks h lost) when the session already ended.
func (s *session) track(h *Hold) bool {
	s.mu.Lock()
	if s.err != nil {
		err := s.err
		s.mu.Unlock()
		h.markLost(err)
		return false
	}
	s.holds[h] = struct{}{}
	s.mu.Unlock()
	return true
}

func (s *session) untrack(h *Hold) {
	s.mu.Lock()
	delete(s.holds, h)
	s.mu.Unlock()
}

// isLost reports whether err says a hold's session ended.
func isLost(err error) bool { return errors.Is(err, ErrSessionLost) }
