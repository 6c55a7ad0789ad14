package server

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
	"github.com/charonlimit/charon/internal/copystore/memcopy"
	"github.com/charonlimit/charon/internal/engine"
)

// TestSlowClientsCutOff: a client that sends part of a request and then
// nothing is disconnected after HTTPReadTimeout, on the HTTP port (a body
// that never comes) and the debug port (headers that never end).
func TestSlowClientsCutOff(t *testing.T) {
	s, stop := newTestServer(t, Options{HTTPReadTimeout: 200 * time.Millisecond})
	defer stop()
	for _, tc := range []struct{ addr, partial string }{
		{s.HTTPAddr(), "POST /json HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"domain\":"},
		{s.DebugAddr(), "GET /metrics HTTP/1.1\r\nHost: x\r\n"},
	} {
		c, err := net.Dial("tcp", tc.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := io.WriteString(c, tc.partial); err != nil {
			t.Fatal(err)
		}
		// The server must close the connection long before this deadline
		// (which only keeps a broken server from hanging the test).
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, err = io.Copy(io.Discard, c)
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Errorf("%s: a slow client was kept for 30 s", tc.addr)
		}
	}
}

// TestMaxConcurrentStreams: with one stream per connection, a call waits
// while a Session stream is open (and fails at its deadline), and goes
// through once the stream ends.
func TestMaxConcurrentStreams(t *testing.T) {
	copies := memcopy.New(memcopy.Options{})
	defer copies.Close()
	eng := engine.New(engine.Options{Copies: copies})
	eng.SetTree(charonTree(t))
	s, stop := newTestServer(t, Options{Engine: eng, MaxConcurrentStreams: 1})
	defer stop()
	cc := dial(t, s.GRPCAddr())
	health := healthpb.NewHealthClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := health.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	stCtx, endStream := context.WithCancel(ctx)
	st, err := charonv1.NewCharonClient(cc).Session(stCtx)
	if err != nil {
		t.Fatal(err)
	}
	st.Send(&charonv1.SessionRequest{Id: 1, Operation: &charonv1.SessionRequest_Reserve{Reserve: &charonv1.ReserveRequest{Resource: res("c", "db", "a"), Copies: 1}}})
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelShort()
	if _, err := health.Check(short, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("a second stream on a connection allowed one: %v, want DeadlineExceeded", err)
	}
	endStream()
	if _, err := health.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("after the stream ended: %v", err)
	}
}

// TestShutdownDelayDrains: once Serve's context is done, health is
// NOT_SERVING and /healthcheck 500 while decisions are still answered; the
// server stops after the delay. ErrStopNow skips the drain.
func TestShutdownDelayDrains(t *testing.T) {
	s, err := New(Options{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Engine: &fakeEngine{}, ShutdownDelay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	cc := dial(t, s.GRPCAddr())
	wait, cancelWait := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancelWait()
	health := healthpb.NewHealthClient(cc)
	if h, err := health.Check(wait, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("before: %v, %v", h, err)
	}
	cancel(nil)
	for {
		h, err := health.Check(wait, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if h.Status == healthpb.HealthCheckResponse_NOT_SERVING {
			break
		}
	}
	resp, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(wait, &rlsv3.RateLimitRequest{Domain: "d",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a", "x")}})
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Errorf("a decision while draining: %v, %v", resp, err)
	}
	hr, err := http.Get("http://" + s.HTTPAddr() + "/healthcheck")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(bufio.NewReader(hr.Body))
	hr.Body.Close()
	if hr.StatusCode != http.StatusInternalServerError {
		t.Errorf("/healthcheck while draining: %d %s, want 500", hr.StatusCode, body)
	}
	select {
	case err := <-done:
		t.Fatalf("Serve returned during the drain: %v", err)
	default:
	}
	s.EndDrain()
	if err := <-done; err != nil {
		t.Errorf("Serve: %v", err)
	}

	// A second server: ErrStopNow stops it at once despite an hour's delay.
	s2, err := New(Options{GRPCAddr: "127.0.0.1:0", Engine: &fakeEngine{}, ShutdownDelay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithCancelCause(context.Background())
	done2 := make(chan error, 1)
	go func() { done2 <- s2.Serve(ctx2) }()
	cancel2(ErrStopNow)
	select {
	case err := <-done2:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("ErrStopNow did not skip the drain")
	}
}
