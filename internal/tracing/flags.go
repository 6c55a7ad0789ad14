package tracing

import (
	"flag"
	"fmt"
	"strings"
)

// Flags are the tracing settings of charon serve as command-line flags:
// On turns tracing on with Options. Start from DefaultFlags.
type Flags struct {
	On bool
	Options
}

// DefaultFlags returns charon serve's defaults: off, service "charon",
// OTLP over HTTP, every new trace sampled.
func DefaultFlags() Flags {
	return Flags{Options: Options{ServiceName: "charon", Protocol: "http", SamplingRate: 1}}
}

// Bind declares the flags on fs with f's values as defaults.
func (f *Flags) Bind(fs *flag.FlagSet) {
	fs.BoolVar(&f.On, "tracing", f.On, "send OpenTelemetry traces of gRPC and Redis calls over OTLP, to the endpoint of the OTEL_EXPORTER_OTLP_* variables")
	// The resource's attributes: --tracing-service-name sets service.name.
	for _, a := range []struct {
		v          *string
		attr, more string
	}{{&f.ServiceName, "service.name", ""}, {&f.ServiceNamespace, "service.namespace", ""}, {&f.InstanceID, "service.instance.id", "; empty: a random one"}} {
		fs.StringVar(a.v, "tracing-"+strings.ReplaceAll(a.attr, ".", "-"), *a.v, "the traces' "+a.attr+a.more)
	}
	fs.StringVar(&f.Protocol, "tracing-protocol", f.Protocol, "OTLP transport: http or grpc")
	fs.Float64Var(&f.SamplingRate, "tracing-sampling-rate", f.SamplingRate, "share of new traces sampled, 0 to 1")
}

// Check refuses values that cannot work, naming the flag.
func (f *Flags) Check() error {
	if f.Protocol != "http" && f.Protocol != "grpc" {
		return fmt.Errorf("--tracing-protocol %q: want http or grpc", f.Protocol)
	}
	if !(f.SamplingRate >= 0 && f.SamplingRate <= 1) {
		return fmt.Errorf("--tracing-sampling-rate %v: want 0 to 1", f.SamplingRate)
	}
	return nil
}
