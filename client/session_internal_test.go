package client

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
	"github.com/charonlimit/charon/descriptors"
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

func (r *sendRecorder) CloseSend() error { return nil }

func (r *sendRecorder) Sent() []*charonv1.SessionRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*charonv1.SessionRequest(nil), r.sent...)
}

// writing returns a session of rec whose writer runs until the test ends;
// it has no reader.
func writing(t *testing.T, rec *sendRecorder) *session {
	t.Helper()
	s := newSession(rec, func() {})
	go s.write()
	t.Cleanup(func() {
		s.end(errors.New("test over"))
		<-s.written
	})
	return s
}

// received waits for rec's next Send; a guard, not a sleep.
func received(t *testing.T, rec *sendRecorder, what string) {
	t.Helper()
	select {
	case <-rec.got:
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// TestAbandonReleasesADeliveredGrant covers the answer that reaches the
// reader as its caller's deadline passes: the reader has taken it off
// pending and put it in the caller's channel, the caller has seen its
// context end. The grant must be given back, not left held until the
// session ends.
func TestAbandonReleasesADeliveredGrant(t *testing.T) {
	rec := &sendRecorder{got: make(chan struct{}, 1)}
	s := writing(t, rec)
	s.nextID = 7
	ch := make(chan *charonv1.SessionResponse, 1)
	// What read does with the answer of call 7 under mu.
	ch <- &charonv1.SessionResponse{Id: 7, Result: &charonv1.SessionResponse_Reserve{
		Reserve: &charonv1.ReserveResponse{Ok: true, Granted: 2, HoldId: "h7"},
	}}
	s.abandon(7, ch)
	received(t, rec, "the release of h7")
	if sent := rec.Sent(); len(sent) != 1 || sent[0].GetRelease().GetHoldId() != "h7" {
		t.Fatalf("sent %v; want one release of h7", sent)
	}
}

// TestAbandonOfAPendingCall: a call still pending is dropped from pending
// and nothing is sent; its late answer becomes an orphan for the reader.
func TestAbandonOfAPendingCall(t *testing.T) {
	rec := &sendRecorder{got: make(chan struct{}, 1)}
	ch := make(chan *charonv1.SessionResponse, 1)
	s := newSession(rec, func() {})
	s.pending[3] = ch
	s.abandon(3, ch)
	if _, ok := s.pending[3]; ok {
		t.Error("call 3 still pending after abandon")
	}
	if sent := rec.Sent(); len(sent) != 0 {
		t.Errorf("sent %v; want nothing", sent)
	}
}

// TestWriterSkipsAbandonedCalls: a call handed to the writer whose caller
// gave up before its turn (no longer pending) is not sent, so nothing is
// reserved for nobody; a call still pending, and an orphan's release, which
// has no pending entry, are.
func TestWriterSkipsAbandonedCalls(t *testing.T) {
	rec := &sendRecorder{got: make(chan struct{}, 1)}
	s := writing(t, rec)
	reserve := func(id uint64) *charonv1.SessionRequest {
		return &charonv1.SessionRequest{Id: id, Operation: &charonv1.SessionRequest_Reserve{
			Reserve: &charonv1.ReserveRequest{Copies: 1},
		}}
	}
	s.mu.Lock()
	s.pending[2] = make(chan *charonv1.SessionResponse, 1) // 1 is abandoned
	s.nextID = 2
	s.mu.Unlock()
	s.calls <- reserve(1)
	s.calls <- reserve(2)
	received(t, rec, "call 2")
	s.releaseOrphan("h9")
	received(t, rec, "the release of h9")
	sent := rec.Sent()
	if len(sent) != 2 || sent[0].GetId() != 2 || sent[1].GetRelease().GetHoldId() != "h9" {
		t.Fatalf("sent %v; want call 2, then the release of h9", sent)
	}
	if id := sent[1].GetId(); id <= 2 {
		t.Errorf("the release has id %d; want a fresh id above 2", id)
	}
}

// TestMaxRequestSizeAboveValidOperations: the largest operations the
// server accepts (descriptors.MaxEntries entries, descriptors.MaxLen bytes
// each, the widest integers) are well under the client's bound, so the bound refuses
// only what the server would refuse too.
func TestMaxRequestSizeAboveValidOperations(t *testing.T) {
	long := strings.Repeat("x", descriptors.MaxLen)
	r := &charonv1.Resource{Domain: long}
	for range descriptors.MaxEntries {
		r.Entries = append(r.Entries, &charonv1.Entry{Key: long, Value: long})
	}
	lease := 1<<63 - 1 // the longest time.Duration
	for _, tc := range []struct {
		name string
		m    proto.Message
	}{
		{"reserve", &charonv1.SessionRequest{Id: 1<<64 - 1, Operation: &charonv1.SessionRequest_Reserve{Reserve: &charonv1.ReserveRequest{
			Resource: r, Copies: 1<<63 - 1, MinCopies: 1<<63 - 1, Lease: durationOrNil(time.Duration(lease)),
		}}}},
		{"request", &charonv1.RequestRequest{Resource: r, Copies: 1<<63 - 1, MinCopies: 1<<63 - 1}},
	} {
		n := proto.Size(tc.m)
		if n > maxRequestSize/3*2 {
			t.Errorf("%s: the largest valid one is %d bytes; want well under maxRequestSize %d", tc.name, n, maxRequestSize)
		}
		if err := checkSize(tc.m); err != nil {
			t.Errorf("%s: got %v, want nil", tc.name, err)
		}
	}
}

// TestCallRefusesAnOversizedRequest: nothing oversized reaches the writer.
func TestCallRefusesAnOversizedRequest(t *testing.T) {
	rec := &sendRecorder{got: make(chan struct{}, 1)}
	s := newSession(rec, func() {})
	req := &charonv1.SessionRequest{Operation: &charonv1.SessionRequest_Release{
		Release: &charonv1.ReleaseRequest{HoldId: strings.Repeat("h", maxRequestSize)},
	}}
	if _, err := s.call(context.Background(), req); !errors.Is(err, ErrInvalid) {
		t.Errorf("got %v, want ErrInvalid", err)
	}
	if len(s.pending) != 0 || s.nextID != 0 {
		t.Errorf("pending %v, next id %d; want nothing registered", s.pending, s.nextID)
	}
}
