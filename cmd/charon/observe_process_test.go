package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/charonlimit/charon/internal/redistest"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
)

// TestDecisionLogToSuggest runs the loop an operator runs: serve with a
// decision log, send traffic, stop, propose limits from the log with
// charon suggest, and check the proposal with charon config check.
func TestDecisionLogToSuggest(t *testing.T) {
	bin := buildCharon(t)
	dir := t.TempDir()
	logPath := filepath.Join(dir, "decisions.jsonl")
	var errb strings.Builder
	if code := run([]string{"serve", "--decision-log", logPath, "--decision-log-sample", "2"}, os.Getenv, &errb, &errb); code == 0 ||
		!strings.Contains(errb.String(), "--decision-log-sample") {
		t.Errorf("a sample of 2: exit %d, %q", code, errb.String())
	}
	p := startServe(t, bin, "--config", "../../examples/config", "--decision-log", logPath, "--decision-log-sample", "1")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 40 {
		user := "alice"
		if i%4 == 0 {
			user = "bob"
		}
		_, err := p.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: user}}},
		}})
		if err != nil {
			t.Fatal(err)
		}
	}
	p.stop(t)
	b, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n != 40 || !strings.Contains(string(b), `"result":"rejected"`) {
		t.Fatalf("the log has %d lines (want 40, rejections among them):\n%s", n, b)
	}
	out := filepath.Join(dir, "proposal")
	var stdout strings.Builder
	errb.Reset()
	if code := run([]string{"suggest", "--log", logPath, "--reject", "0", "--window", "1h", "--out", out}, os.Getenv, &stdout, &errb); code != 0 {
		t.Fatalf("charon suggest: exit %d: %s", code, errb.String())
	}
	proposal, err := os.ReadFile(filepath.Join(out, "api.yaml"))
	if err != nil || !strings.Contains(string(proposal), "limit: 30") {
		t.Errorf("proposal (want alice's 30 in an hour allowed):\n%s %v", proposal, err)
	}
	if code := run([]string{"config", "check", out}, os.Getenv, &stdout, &errb); code != 0 {
		t.Errorf("charon config check of the proposal: exit %d: %s", code, errb.String())
	}
}

// otlpReceiver is an OTLP trace collector in the test process.
type otlpReceiver struct {
	collectortrace.UnimplementedTraceServiceServer
	mu    sync.Mutex
	names map[string]int
	redis int
}

func (r *otlpReceiver) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				r.names[sp.GetName()]++
				for _, a := range sp.GetAttributes() {
					if a.GetKey() == "db.system" && a.GetValue().GetStringValue() == "redis" {
						r.redis++
					}
				}
			}
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// TestServeTracing: with envoyproxy/ratelimit's TRACING_* variables and
// the standard OTEL_EXPORTER_OTLP_* ones, `charon serve` sends spans of
// ShouldRateLimit and of its Redis calls to an OTLP collector.
func TestServeTracing(t *testing.T) {
	r := redistest.Single(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	recv := &otlpReceiver{names: map[string]int{}}
	gs := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(gs, recv)
	go gs.Serve(lis)
	defer gs.Stop()

	p := startServeEnv(t, buildCharon(t), []string{"TRACING_ENABLED=true", "TRACING_EXPORTER_PROTOCOL=grpc",
		"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + lis.Addr().String(), "OTEL_EXPORTER_OTLP_INSECURE=true"},
		"--config", writeRedisConfig(t), "--store", "redis", "--redis-url", "redis://"+r.Addr())
	for i := 0; i < 3; i++ {
		p.mustOK(t, "user", "traced")
	}
	p.stop(t) // flushes the spans
	recv.mu.Lock()
	defer recv.mu.Unlock()
	if n := recv.names["envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"]; n != 3 {
		t.Errorf("%d ShouldRateLimit spans, want 3 (all: %v)", n, recv.names)
	}
	if recv.redis == 0 {
		t.Errorf("no Redis span (all: %v)", recv.names)
	}
}

// TestBenchWorkloads runs `charon bench` against `charon serve` on
// examples/config in the workloads make bench and make bench-redis measure:
// one descriptor over many users, the hot key limited to 100/s, and three
// descriptors per request with a deadline. Every request is answered, and
// the hot key is mostly over its limit.
func TestBenchWorkloads(t *testing.T) {
	p := startServe(t, buildCharon(t), "--config", "../../examples/config")
	for _, tc := range []struct {
		name string
		args []string
		over bool
	}{
		{"users", []string{"--key", "user", "--keys", "1000"}, false},
		{"hot", []string{"--key", "hot", "--hot"}, true},
		{"three", []string{"--three", "--keys", "1000", "--timeout", "10s"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb strings.Builder
			args := append([]string{"bench", "--addr", p.grpcAddr, "--domain", "bench", "--concurrency", "4",
				"--duration", "500ms", "--warmup", "100ms"}, tc.args...)
			if code := run(args, os.Getenv, &out, &errb); code != 0 {
				t.Fatalf("charon %s: exit %d\n%s%s", strings.Join(args, " "), code, out.String(), errb.String())
			}
			got := out.String()
			if !strings.Contains(got, "errors=0 ") || strings.Contains(got, " requests=0 ") {
				t.Fatalf("charon bench %s: %s", tc.name, got)
			}
			if over := !strings.Contains(got, "over_limit=0 "); over != tc.over {
				t.Errorf("charon bench %s: over-limit answers %v, want %v: %s", tc.name, over, tc.over, got)
			}
		})
	}
}
