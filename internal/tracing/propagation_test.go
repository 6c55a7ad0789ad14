package tracing

import (
	"context"
	"net/http"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestPropagator: a span started from a request carrying the caller's trace
// in B3 (one b3 header, or X-B3-* headers) or W3C Trace Context is in that
// trace, the child of the caller's span; with both, traceparent wins.
func TestPropagator(t *testing.T) {
	const (
		traceID = "463ac35c9f6413ad48485a3953bb6124"
		spanID  = "a2fb4a1d1a96d312"
		w3cID   = "0af7651916cd43dd8448eb211c80319c"
		w3cSpan = "b7ad6b7169203331"
	)
	for _, tc := range []struct {
		name              string
		headers           map[string]string
		wantTrace, parent string
	}{
		{"b3 single", map[string]string{"b3": traceID + "-" + spanID + "-1"}, traceID, spanID},
		{"b3 single, 64-bit trace id", map[string]string{"b3": "48485a3953bb6124-" + spanID + "-1"}, "000000000000000048485a3953bb6124", spanID},
		{"b3 multi", map[string]string{"X-B3-TraceId": traceID, "X-B3-SpanId": spanID, "X-B3-Sampled": "1"}, traceID, spanID},
		{"traceparent", map[string]string{"traceparent": "00-" + w3cID + "-" + w3cSpan + "-01"}, w3cID, w3cSpan},
		{"both", map[string]string{"traceparent": "00-" + w3cID + "-" + w3cSpan + "-01", "b3": traceID + "-" + spanID + "-1"}, w3cID, w3cSpan},
	} {
		h := http.Header{}
		for k, v := range tc.headers {
			h.Set(k, v)
		}
		exp := tracetest.NewInMemoryExporter()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.NeverSample())))
		ctx := Propagator().Extract(context.Background(), propagation.HeaderCarrier(h))
		_, span := tp.Tracer("test").Start(ctx, "ShouldRateLimit")
		span.End()
		spans := exp.GetSpans() // before Shutdown, which empties the exporter
		tp.Shutdown(context.Background())
		if len(spans) != 1 {
			t.Errorf("%s: %d spans exported, want 1 (the caller sampled it)", tc.name, len(spans))
			continue
		}
		if got := spans[0].SpanContext.TraceID().String(); got != tc.wantTrace {
			t.Errorf("%s: trace %s, want %s", tc.name, got, tc.wantTrace)
		}
		if got := spans[0].Parent.SpanID().String(); got != tc.parent || !spans[0].Parent.IsRemote() {
			t.Errorf("%s: parent %s (remote %v), want the caller's %s", tc.name, got, spans[0].Parent.IsRemote(), tc.parent)
		}
	}
}
