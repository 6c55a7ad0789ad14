// Package tracing sets up OpenTelemetry tracing for `charon serve`: an OTLP
// exporter (its endpoint, headers and TLS from the standard
// OTEL_EXPORTER_OTLP_* variables) behind a batching tracer provider with a
// ratio sampler, as envoyproxy/ratelimit's TRACING_* settings describe it,
// and the propagation of callers' traces: W3C Trace Context and B3.
package tracing

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"go.opentelemetry.io/contrib/propagators/b3"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Options configure the tracer provider.
type Options struct {
	// ServiceName, ServiceNamespace and InstanceID are the resource's
	// service.name, service.namespace and service.instance.id (an empty
	// InstanceID gets a random one).
	ServiceName, ServiceNamespace, InstanceID string
	// Protocol is the OTLP transport: "grpc" or "http" (protobuf over HTTP).
	Protocol string
	// SamplingRate is the share of new traces sampled, in [0, 1]; a
	// request that arrives with a sampled parent is sampled.
	SamplingRate float64
	// Client, when set, replaces the exporter's client (tests).
	Client otlptrace.Client
}

// Provider is a running tracer provider.
type Provider struct {
	tp *sdktrace.TracerProvider
}

// New starts the exporter and the provider and makes them the global ones
// (otelgrpc and redisotel take them from there).
func New(ctx context.Context, o Options) (*Provider, error) {
	client := o.Client
	if client == nil {
		switch o.Protocol {
		case "http", "":
			client = otlptracehttp.NewClient()
		case "grpc":
			client = otlptracegrpc.NewClient()
		default:
			return nil, fmt.Errorf("tracing protocol %q: want grpc or http", o.Protocol)
		}
	}
	if o.SamplingRate < 0 || o.SamplingRate > 1 {
		return nil, fmt.Errorf("tracing sampling rate %v: want 0 to 1", o.SamplingRate)
	}
	exp, err := otlptrace.New(ctx, client)
	if err != nil {
		return nil, err
	}
	id := o.InstanceID
	if id == "" {
		var b [8]byte
		rand.Read(b[:])
		id = hex.EncodeToString(b[:])
	}
	res := resource.NewSchemaless(
		attribute.String("service.name", o.ServiceName),
		attribute.String("service.namespace", o.ServiceNamespace),
		attribute.String("service.instance.id", id),
	)
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(o.SamplingRate))),
	)
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(Propagator())
	return &Provider{tp: tp}, nil
}

// Propagator is how a caller's trace reaches Charon's spans, on gRPC
// metadata and HTTP headers alike: W3C Trace Context (traceparent) and
// baggage, and Zipkin's B3, as a single b3 header or as X-B3-* headers
// (what Envoy sends when its tracer is Zipkin). When a request carries both,
// traceparent wins. B3 is injected (on calls Charon makes) as X-B3-*
// headers beside traceparent.
func Propagator() propagation.TextMapPropagator {
	return propagation.NewCompositeTextMapPropagator(
		b3.New(b3.WithInjectEncoding(b3.B3MultipleHeader)),
		propagation.TraceContext{}, propagation.Baggage{})
}

// Tracer returns a tracer of the provider.
func (p *Provider) Tracer(name string) trace.Tracer { return p.tp.Tracer(name) }

// Shutdown sends what is buffered and stops the exporter.
func (p *Provider) Shutdown(ctx context.Context) error { return p.tp.Shutdown(ctx) }
