package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// freeAddrs returns n distinct loopback addresses whose ports were free a
// moment ago (serve's flags take addresses, so ":0" cannot be read back).
func freeAddrs(t *testing.T, n int) []string {
	t.Helper()
	var ls []net.Listener
	var addrs []string
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		addrs = append(addrs, l.Addr().String())
	}
	for _, l := range ls {
		l.Close()
	}
	return addrs
}

var (
	buildOnce sync.Once
	binDir    string // removed by TestMain
	builtBin  string
	buildErr  error
	buildOut  []byte
)

// buildCharon builds the binary once per test binary run and returns its
// path; with -short it skips the test, which runs the binary.
func buildCharon(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	buildOnce.Do(func() {
		if binDir, buildErr = os.MkdirTemp("", "charon-test-"); buildErr != nil {
			return
		}
		builtBin = filepath.Join(binDir, "charon")
		buildOut, buildErr = exec.Command("go", "build", "-o", builtBin, ".").CombinedOutput()
	})
	if buildErr != nil {
		t.Fatalf("go build: %v\n%s", buildErr, buildOut)
	}
	return builtBin
}

// TestMain removes the test binary's build directory and fails the tests if
// any goroutine outlives them.
func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// TestServeProcess runs the real binary: it starts on free ports with
// examples/config, turns healthy, answers ShouldRateLimit, and exits 0 on
// SIGTERM.
func TestServeProcess(t *testing.T) {
	bin := buildCharon(t)
	p := startServe(t, bin, "--config", "../../examples/config", "--response-headers", "--shutdown-delay", "10m")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h, err := p.health.Check(ctx, &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
	if err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v, %v", h, err)
	}
	resp, err := p.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
		Domain: "bench",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "alice"}},
		}},
	})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v\n%s", err, p.stderr.String())
	}
	if resp.OverallCode != rlsv3.RateLimitResponse_OK || len(resp.Statuses) != 1 {
		t.Fatalf("got %v, want OK with one status", resp)
	}
	if l := resp.Statuses[0].GetCurrentLimit(); l.GetRequestsPerUnit() != 1000 || l.GetUnit() != rlsv3.RateLimitResponse_RateLimit_SECOND {
		t.Errorf("current_limit %v, want 1000 per SECOND", l)
	}

	// charon health, the image's HEALTHCHECK: 0 and SERVING; 1 for an
	// unknown service; 1 with nothing listening.
	var out, errb strings.Builder
	if code := run([]string{"health", "--addr", p.grpcAddr}, os.Getenv, &out, &errb); code != 0 || out.String() != "SERVING\n" {
		t.Errorf("charon health: exit %d, %q %s", code, out.String(), errb.String())
	}
	if code := run([]string{"health", "--addr", p.grpcAddr, "--service", "nope"}, os.Getenv, &out, &errb); code != 1 {
		t.Errorf("charon health --service nope: exit %d, want 1", code)
	}
	if code := run([]string{"health", "--addr", freeAddrs(t, 1)[0], "--timeout", "1s"}, os.Getenv, &out, &errb); code != 1 {
		t.Errorf("charon health with no server: exit %d, want 1", code)
	}

	// charon explain: the pair alice just used, read back.
	out.Reset()
	if code := run([]string{"explain", "--addr", p.grpcAddr, "--domain", "bench", "--descriptor", "user=alice"}, os.Getenv, &out, &errb); code != 0 ||
		!strings.Contains(out.String(), "bench.yaml:") || !strings.Contains(out.String(), "999 more hits now") {
		t.Errorf("charon explain: exit %d\n%s%s", code, out.String(), errb.String())
	}

	// SIGTERM: the drain. /healthcheck turns 500 while decisions are
	// still answered; a second SIGTERM ends the 10-minute drain.
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := http.Get("http://" + p.httpAddr + "/healthcheck")
		if err != nil {
			t.Fatalf("/healthcheck while draining: %v\n%s", err, p.stderr.String())
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusInternalServerError {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := p.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "bench",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "bob"}}}},
	}); err != nil {
		t.Errorf("ShouldRateLimit while draining: %v", err)
	}
	p.stop(t)
	if !strings.Contains(p.stderr.String(), "stopped") {
		t.Errorf("log lacks the stop message:\n%s", p.stderr.String())
	}
}
