package main

import (
	"context"
	"net"
	"sync"
	"testing"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"

	"github.com/charonlimit/charon/internal/redistest"
)

// otlpReceiver is an OTLP trace collector in the test process.
type otlpReceiver struct {
	collectortrace.UnimplementedTraceServiceServer
	mu    sync.Mutex
	names map[string]int
	redis int
}

func (r *otlpReceiver) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				r.names[sp.GetName()]++
				for _, a := range sp.GetAttributes() {
					if a.GetKey() == "db.system" && a.GetValue().GetStringValue() == "redis" {
						r.redis++
					}
				}
			}
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// TestServeTracing: with envoyproxy/ratelimit's TRACING_* variables and
// the standard OTEL_EXPORTER_OTLP_* ones, `charon serve` sends spans of
// ShouldRateLimit and of its Redis calls to an OTLP collector.
func TestServeTracing(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the binary and redis-server")
	}
	r := redistest.Single(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	recv := &otlpReceiver{names: map[string]int{}}
	gs := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(gs, recv)
	go gs.Serve(lis)
	defer gs.Stop()

	p := startServeEnv(t, buildCharon(t), []string{"TRACING_ENABLED=true", "TRACING_EXPORTER_PROTOCOL=grpc",
		"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + lis.Addr().String(), "OTEL_EXPORTER_OTLP_INSECURE=true"},
		"--config", writeRedisConfig(t), "--store", "redis", "--redis-url", "redis://"+r.Addr())
	for i := 0; i < 3; i++ {
		p.mustOK(t, "user", "traced")
	}
	p.stop(t) // flushes the spans
	recv.mu.Lock()
	defer recv.mu.Unlock()
	if n := recv.names["envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"]; n != 3 {
		t.Errorf("%d ShouldRateLimit spans, want 3 (all: %v)", n, recv.names)
	}
	if recv.redis == 0 {
		t.Errorf("no Redis span (all: %v)", recv.names)
	}
}
