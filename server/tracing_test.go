package server

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"

	"github.com/charonlimit/charon/internal/tracing"
)

// TestTracedCallers: with Tracing, a ShouldRateLimit over gRPC and a /json
// request each start a server span in the caller's trace, whether the
// caller sent it as B3 (a b3 header, or X-B3-* headers) or W3C Trace
// Context; /json's span carries its route and status.
func TestTracedCallers(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	prevTP, prevProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(tracing.Propagator())
	t.Cleanup(func() {
		tp.Shutdown(context.Background())
		otel.SetTracerProvider(prevTP)
		otel.SetTextMapPropagator(prevProp)
	})
	s, stop := newTestServer(t, Options{Tracing: true})
	defer stop()
	c := rlsv3.NewRateLimitServiceClient(dial(t, s.GRPCAddr()))

	const (
		traceID = "463ac35c9f6413ad48485a3953bb6124"
		spanID  = "a2fb4a1d1a96d312"
	)
	headers := map[string]map[string]string{
		"b3 single":   {"b3": traceID + "-" + spanID + "-1"},
		"b3 multi":    {"x-b3-traceid": traceID, "x-b3-spanid": spanID, "x-b3-sampled": "1"},
		"traceparent": {"traceparent": "00-" + traceID + "-" + spanID + "-01"},
	}
	for name, h := range headers {
		for _, via := range []string{"grpc", "json"} {
			exp.Reset()
			switch via {
			case "grpc":
				ctx := metadata.NewOutgoingContext(context.Background(), metadata.New(h))
				if _, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d",
					Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("k", "v")}}); err != nil {
					t.Fatal(err)
				}
			case "json":
				req, _ := http.NewRequest("POST", "http://"+s.HTTPAddr()+"/json",
					strings.NewReader(`{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"over"}]}]}`))
				for k, v := range h {
					req.Header.Set(k, v)
				}
				resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
			}
			// The server ends its span after answering: wait for it.
			var spans tracetest.SpanStubs
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
				if spans = exp.GetSpans(); len(spans) > 0 {
					break
				}
			}
			if len(spans) != 1 {
				t.Errorf("%s over %s: %d spans, want 1", name, via, len(spans))
				continue
			}
			sp := spans[0]
			if sp.SpanKind != trace.SpanKindServer || sp.SpanContext.TraceID().String() != traceID || sp.Parent.SpanID().String() != spanID {
				t.Errorf("%s over %s: span %q kind %v trace %s parent %s; want a server span in trace %s, child of %s",
					name, via, sp.Name, sp.SpanKind, sp.SpanContext.TraceID(), sp.Parent.SpanID(), traceID, spanID)
			}
			if via == "json" {
				attrs := map[attribute.Key]attribute.Value{}
				for _, a := range sp.Attributes {
					attrs[a.Key] = a.Value
				}
				if sp.Name != "POST /json" || attrs["http.route"].AsString() != "/json" || attrs["http.response.status_code"].AsInt64() != 429 {
					t.Errorf("%s over json: span %q, attributes %v; want POST /json, route /json, status 429", name, sp.Name, sp.Attributes)
				}
			}
		}
	}
}
