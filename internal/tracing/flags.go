package tracing

import (
	"flag"
	"fmt"
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
	fs.StringVar(&f.ServiceName, "tracing-service-name", f.ServiceName, "the traces' service.name")
	fs.StringVar(&f.ServiceNamespace, "tracing-service-namespace", f.ServiceNamespace, "the traces' service.namespace")
	fs.StringVar(&f.InstanceID, "tracing-service-instance-id", f.InstanceID, "the traces' service.instance.id; empty: a random one")
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
