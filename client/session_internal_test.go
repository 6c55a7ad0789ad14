package client

import (
	"sync"
	"testing"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
)

// sendRecorder is a Session stream that records what is sent.
type sendRecorder struct {
	charonv1.Charon_SessionClient
	mu   sync.Mutex
	sent []*charonv1.SessionRequest
	got  chan struct{}
}

func (r *sendRecorder) Send(req *charonv1.SessionRequest) error {
	r.mu.Lock()
	r.sent = append(r.sent, req)
	r.mu.Unlock()
	r.got <- struct{}{}
	return nil
}

// TestAbandonReleasesADeliveredGrant covers the answer that reaches the
// reader as its caller's deadline passes: the reader has taken it off
// pending and put it in the caller's channel, the caller has seen its
// context end. The grant must be given back, not left held until the
// session ends.
func TestAbandonReleasesADeliveredGrant(t *testing.T) {
	rec := &sendRecorder{got: make(chan struct{}, 1)}
	s := &session{
		stream:  rec,
		pending: map[uint64]chan *charonv1.SessionResponse{},
		holds:   map[*Hold]struct{}{},
		done:    make(chan struct{}),
		nextID:  7,
	}
	ch := make(chan *charonv1.SessionResponse, 1)
	// What read does with the answer of call 7 under mu.
	ch <- &charonv1.SessionResponse{Id: 7, Result: &charonv1.SessionResponse_Reserve{
		Reserve: &charonv1.ReserveResponse{Ok: true, Granted: 2, HoldId: "h7"},
	}}
	s.abandon(7, ch)
	<-rec.got
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.sent) != 1 || rec.sent[0].GetRelease().GetHoldId() != "h7" {
		t.Fatalf("sent %v; want one release of h7", rec.sent)
	}
}

// TestAbandonOfAPendingCall: a call still pending is dropped from pending
// and nothing is sent; its late answer becomes an orphan for the reader.
func TestAbandonOfAPendingCall(t *testing.T) {
	rec := &sendRecorder{got: make(chan struct{}, 1)}
	ch := make(chan *charonv1.SessionResponse, 1)
	s := &session{
		stream:  rec,
		pending: map[uint64]chan *charonv1.SessionResponse{3: ch},
		done:    make(chan struct{}),
	}
	s.abandon(3, ch)
	if _, ok := s.pending[3]; ok {
		t.Error("call 3 still pending after abandon")
	}
	if len(rec.sent) != 0 {
		t.Errorf("sent %v; want nothing", rec.sent)
	}
}
