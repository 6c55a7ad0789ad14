package clientcmd

import (
	"context"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Health asks a server's gRPC health service, for probes where there is
// no shell or curl (the image's HEALTHCHECK): exit 0 when SERVING.
func Health(args []string, stdout, stderr io.Writer) error {
	fs := FlagSet("health", stderr)
	var cf connFlags
	cf.declare(fs, "127.0.0.1:8081", 2*time.Second)
	service := fs.String("service", "", "health service `name` (\"\": the server)")
	if err := ParseFlags(fs, args); err != nil {
		return err
	}
	var resp *healthpb.HealthCheckResponse
	err := cf.call(func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{Service: *service})
		return err
	})
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, resp.GetStatus())
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return ErrReported
	}
	return nil
}
