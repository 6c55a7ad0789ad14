package server

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"testing/fstest"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/charonlimit/charon/config"
)

// TestWaitForConfig: before its first configuration a server told to wait
// is NOT_SERVING and answers UNAVAILABLE, whatever the store's health says;
// ApplyConfig ends the wait, and /rlconfig and the metrics name the
// version in force.
func TestWaitForConfig(t *testing.T) {
	eng := &fakeEngine{}
	const waiting = "waiting for the first from the xDS server cp:1 (set by --config-xds)"
	s, stop := newTestServer(t, Options{Engine: eng, WaitForConfig: true, WaitingFor: waiting})
	defer stop()
	conn := dial(t, s.GRPCAddr())
	hc, rc := healthpb.NewHealthClient(conn), rlsv3.NewRateLimitServiceClient(conn)
	ctx := context.Background()
	health := func() healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: RLSServiceName})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetStatus()
	}
	req := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("k", "v")}}

	if st := health(); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("before the first config: %v, want NOT_SERVING", st)
	}
	s.SetServing(true) // the store says it is fine: still waiting
	if st := health(); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("store up, no config: %v, want NOT_SERVING", st)
	}
	// Both answers say what is awaited, from where, and so what to check.
	if _, err := rc.ShouldRateLimit(ctx, req); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "no configuration yet: "+waiting) {
		t.Errorf("ShouldRateLimit before the first config: %v, want UNAVAILABLE saying %q", err, waiting)
	}
	if body, code := get(t, "http://"+s.HTTPAddr()+"/healthcheck"); code != 500 || !strings.HasPrefix(body, "no configuration yet: "+waiting) {
		t.Errorf("/healthcheck before the first config: %d %q", code, body)
	}

	cfg, _, err := config.Load(fstest.MapFS{"r": {Data: []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")}}, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s.ApplyConfig(cfg, "xds", "v1")
	if st := health(); st != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("after the first config: %v, want SERVING", st)
	}
	if _, err := rc.ShouldRateLimit(ctx, req); err != nil {
		t.Errorf("ShouldRateLimit after the first config: %v", err)
	}
	if eng.trees != 1 {
		t.Errorf("engine trees set: %d, want 1", eng.trees)
	}
	if body, _ := get(t, "http://"+s.DebugAddr()+"/rlconfig"); !strings.HasPrefix(body, "# source: xds, version: \"v1\"\n") || !strings.Contains(body, "domain: d") {
		t.Errorf("/rlconfig:\n%s", body)
	}
	s.ApplyConfig(cfg, "xds", "v2")
	body, _ := get(t, "http://"+s.DebugAddr()+"/metrics")
	if !strings.Contains(body, `charon_config_version_info{source="xds",version="v2"} 1`) || strings.Contains(body, `version="v1"`) {
		t.Errorf("/metrics: want only version v2 in charon_config_version_info:\n%s", grepLines(body, "config_"))
	}
	s.ConfigRejected()
	if got := testCounter(t, s.Metrics(), "failure"); got != 1 {
		t.Errorf("failures counted: %v, want 1", got)
	}
	if got := testCounter(t, s.Metrics(), "success"); got != 2 {
		t.Errorf("successes counted: %v, want 2", got)
	}
	s.SetServing(false)
	if st := health(); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("store down: %v, want NOT_SERVING", st)
	}
	if _, code := get(t, "http://"+s.HTTPAddr()+"/healthcheck"); code != http.StatusInternalServerError {
		t.Errorf("/healthcheck with the store down: %d, want 500", code)
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
