package tracing

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type receiver struct {
	collectortrace.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []string
	attrs map[string]string
}

func (r *receiver) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		for _, a := range rs.GetResource().GetAttributes() {
			r.attrs[a.GetKey()] = a.GetValue().GetStringValue()
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				r.spans = append(r.spans, sp.GetName())
			}
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// TestProvider: spans reach an OTLP collector with the resource's service
// attributes; a sampling rate of 0 sends none.
func TestProvider(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	recv := &receiver{attrs: map[string]string{}}
	gs := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(gs, recv)
	go gs.Serve(lis)
	defer gs.Stop()
	for _, rate := range []float64{1, 0} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		p, err := New(ctx, Options{ServiceName: "charon", ServiceNamespace: "edge", InstanceID: "i1", SamplingRate: rate,
			Client: otlptracegrpc.NewClient(otlptracegrpc.WithEndpoint(lis.Addr().String()), otlptracegrpc.WithInsecure())})
		if err != nil {
			t.Fatal(err)
		}
		_, span := p.Tracer("test").Start(ctx, "decide")
		span.End()
		if err := p.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
	}
	recv.mu.Lock()
	defer recv.mu.Unlock()
	if len(recv.spans) != 1 || recv.spans[0] != "decide" {
		t.Errorf("spans %v, want one decide (rate 1), none (rate 0)", recv.spans)
	}
	for k, want := range map[string]string{"service.name": "charon", "service.namespace": "edge", "service.instance.id": "i1"} {
		if recv.attrs[k] != want {
			t.Errorf("resource %s = %q, want %q", k, recv.attrs[k], want)
		}
	}
	if _, err := New(context.Background(), Options{Protocol: "udp"}); err == nil {
		t.Error("an unknown protocol was accepted")
	}
}
