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
type session struct {
	stream charonv1.Charon_SessionClient
	cancel context.CancelFunc

	sendMu sync.Mutex // grpc streams allow one sender at a time

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]chan *charonv1.SessionResponse
	holds   map[*Hold]struct{}
	closing bool
	err     error         // why it ended; set before done is closed
	done    chan struct{} // closed when the stream has ended
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
	s := &session{
		stream:  stream,
		cancel:  cancel,
		pending: make(map[uint64]chan *charonv1.SessionResponse),
		holds:   make(map[*Hold]struct{}),
		done:    make(chan struct{}),
	}
	c.sess = s
	go s.read()
	return s, nil
}

// call sends req and waits for its answer. An Error answer becomes the status
// error a unary call would have returned. If ctx ends first, the call is
// abandoned: a hold granted to it later is released by the reader.
func (s *session) call(ctx context.Context, req *charonv1.SessionRequest) (*charonv1.SessionResponse, error) {
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

	if err := s.send(req); err != nil {
		// The stream is broken; its reason comes from Recv.
		select {
		case <-s.done:
			return nil, s.err
		case <-ctx.Done():
			s.abandon(req.Id, ch)
			return nil, ctx.Err()
		}
	}
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

func (s *session) send(req *charonv1.SessionRequest) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	return s.stream.Send(req)
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
		go s.releaseOrphan(id)
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

func (s *session) releaseOrphan(holdID string) {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return
	}
	s.nextID++
	id := s.nextID // no pending entry: the answer is dropped
	s.mu.Unlock()
	_ = s.send(&charonv1.SessionRequest{Id: id, Operation: &charonv1.SessionRequest_Release{
		Release: &charonv1.ReleaseRequest{HoldId: holdID},
	}})
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
	s.mu.Unlock()
	s.cancel()
	close(s.done)
	for h := range holds {
		h.markLost(s.err)
	}
}

// close ends the stream from this side and waits for the reader to finish.
func (s *session) close() {
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	s.sendMu.Lock()
	_ = s.stream.CloseSend()
	s.sendMu.Unlock()
	s.cancel()
	<-s.done
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
