package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// runHealth asks a server's gRPC health service, for probes where there is
// no shell or curl (the image's HEALTHCHECK): exit 0 when SERVING.
func runHealth(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("charon health", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:8081", "server gRPC `HOST:PORT`")
	service := fs.String("service", "", "health service `name` (\"\": the server)")
	timeout := fs.Duration("timeout", 2*time.Second, "RPC timeout")
	ct := clientTLS(fs)
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return err
		}
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	transport, err := dialOption(ct)
	if err != nil {
		return err
	}
	cc, err := grpc.NewClient(*addr, transport)
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{Service: *service})
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, resp.GetStatus())
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return errReported
	}
	return nil
}
