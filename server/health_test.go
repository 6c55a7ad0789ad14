package server

import (
	"context"
	"net/http"
	"testing"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func TestSetServingDrivesHealth(t *testing.T) {
	s, stop := newTestServer(t, Options{})
	defer stop()
	hc := healthpb.NewHealthClient(dial(t, s.GRPCAddr()))
	check := func() (healthpb.HealthCheckResponse_ServingStatus, int) {
		t.Helper()
		r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: RLSServiceName})
		if err != nil {
			t.Fatal(err)
		}
		// envoyproxy/ratelimit's probes ask for "ratelimit": the same answer.
		if r2, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "ratelimit"}); err != nil || r2.GetStatus() != r.GetStatus() {
			t.Fatalf("health of ratelimit: %v, %v; want %v", r2, err, r.GetStatus())
		}
		resp, err := http.Get("http://" + s.HTTPAddr() + "/healthcheck")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return r.GetStatus(), resp.StatusCode
	}
	if st, code := check(); st != healthpb.HealthCheckResponse_SERVING || code != 200 {
		t.Fatalf("start: %v %d, want SERVING 200", st, code)
	}
	s.SetServing(false)
	if st, code := check(); st != healthpb.HealthCheckResponse_NOT_SERVING || code != 500 {
		t.Fatalf("after SetServing(false): %v %d, want NOT_SERVING 500", st, code)
	}
	s.SetServing(true)
	if st, code := check(); st != healthpb.HealthCheckResponse_SERVING || code != 200 {
		t.Fatalf("after SetServing(true): %v %d, want SERVING 200", st, code)
	}
}
