package xdsconfig

import (
	"bytes"
	"context"
	"io"
	"io/fs"
	"runtime"
	"strings"
	"sync"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/charonlimit/charon/config"
)

// oneReceiverStream is an ADS stream that records which goroutines call
// Recv (gRPC allows one receiver at a time, so the client keeps one) and
// whose Send fails with io.EOF, as gRPC's does once the server has ended
// the stream, from its second call on.
type oneReceiverStream struct {
	ctx       context.Context
	responses chan *discoveryv3.DiscoveryResponse
	closed    chan struct{}

	mu        sync.Mutex
	sends     int
	receivers map[string]bool
}

func goroutineID() string {
	b := make([]byte, 64)
	b = b[:runtime.Stack(b, false)]
	id, _, _ := bytes.Cut(bytes.TrimPrefix(b, []byte("goroutine ")), []byte(" "))
	return string(id)
}

func (s *oneReceiverStream) Recv() (*discoveryv3.DiscoveryResponse, error) {
	s.mu.Lock()
	s.receivers[goroutineID()] = true
	s.mu.Unlock()
	select {
	case r := <-s.responses:
		return r, nil
	case <-s.closed:
		return nil, status.Error(codes.Unavailable, "the server went away")
	case <-s.ctx.Done():
		return nil, s.ctx.Err()
	}
}

func (s *oneReceiverStream) Send(*discoveryv3.DiscoveryRequest) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sends++
	if s.sends == 1 {
		return nil
	}
	close(s.closed)
	return io.EOF
}

// TestSendFailureKeepsOneReceiver: when an ACK's Send fails because the
// server ended the stream, the client reports the stream's status as its
// receiving goroutine gets it, and no other goroutine calls Recv.
func TestSendFailureKeepsOneReceiver(t *testing.T) {
	c, err := New(Options{Addr: "x", Load: func(fsys fs.FS) (*config.Config, []config.Warning, error) {
		return config.Load(fsys, config.Options{})
	}, Apply: func(*config.Config, string) {}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sctx, cancel := context.WithCancel(ctx)
	st := &oneReceiverStream{ctx: sctx, responses: make(chan *discoveryv3.DiscoveryResponse, 1), closed: make(chan struct{}),
		receivers: map[string]bool{}}
	st.responses <- &discoveryv3.DiscoveryResponse{TypeUrl: TypeURL, VersionInfo: "1", Nonce: "n1"}
	got, err := c.exchange(ctx, sctx, cancel, st)
	if !got || status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "went away") {
		t.Errorf("exchange: got %v, err %v; want the response and the stream's UNAVAILABLE", got, err)
	}
	if len(st.receivers) != 1 {
		t.Errorf("Recv called from %d goroutines, want 1", len(st.receivers))
	}
}
