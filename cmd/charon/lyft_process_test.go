package main

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/charonlimit/charon/internal/redistest"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestServeLyftSettings starts `charon serve` with envoyproxy/ratelimit's
// settings and checks each took effect: SHADOW_MODE (OK over the limit),
// RESPONSE_DYNAMIC_METADATA, LIMIT_RESPONSE_HEADERS_ENABLED with
// LIMIT_REMAINING_HEADER, USE_PROMETHEUS on PROMETHEUS_ADDR with its names,
// and USE_STATSD to a TCP listener (gostats' STATSD_PROTOCOL defaults to
// tcp).
func TestServeLyftSettings(t *testing.T) {
	promAddr := freeAddrs(t, 1)[0]
	collector, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer collector.Close()
	_, statsdPort, _ := net.SplitHostPort(collector.Addr().String())
	p := startServeEnv(t, buildCharon(t), []string{"SHADOW_MODE=true", "RESPONSE_DYNAMIC_METADATA=true",
		"LIMIT_RESPONSE_HEADERS_ENABLED=true", "LIMIT_REMAINING_HEADER=X-Left",
		"USE_PROMETHEUS=true", "PROMETHEUS_ADDR=" + promAddr,
		"USE_STATSD=true", "STATSD_HOST=127.0.0.1", "STATSD_PORT=" + statsdPort, "STATS_FLUSH_INTERVAL=50ms"},
		"--config", writeRedisConfig(t))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var last *rlsv3.RateLimitResponse
	for i := 0; i < testLimit+1; i++ {
		last, err = p.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "test",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "lyft"}}}}})
		if err != nil {
			t.Fatal(err)
		}
	}
	if last.OverallCode != rlsv3.RateLimitResponse_OK || last.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("SHADOW_MODE over the limit: %v / %v, want OK / OVER_LIMIT", last.OverallCode, last.Statuses[0].Code)
	}
	if last.DynamicMetadata.GetFields()["domain"].GetStringValue() != "test" {
		t.Errorf("RESPONSE_DYNAMIC_METADATA: %v", last.DynamicMetadata)
	}
	var headers []string
	for _, h := range last.ResponseHeadersToAdd {
		headers = append(headers, h.Key)
	}
	if !strings.Contains(strings.Join(headers, ","), "X-Left") {
		t.Errorf("LIMIT_REMAINING_HEADER: headers %v", headers)
	}
	m := get(t, "http://"+promAddr+"/metrics")
	if n := metricValue(m, `ratelimit_service_rate_limit_over_limit{domain="test",key1="user",key2=""}`); n != 1 {
		t.Errorf("USE_PROMETHEUS: over_limit %v, want 1", n)
	}
	collector.(*net.TCPListener).SetDeadline(time.Now().Add(20 * time.Second))
	conn, err := collector.Accept()
	if err != nil {
		t.Fatalf("USE_STATSD: no TCP connection: %v", err)
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	lines := bufio.NewScanner(conn)
	for !strings.HasPrefix(lines.Text(), "ratelimit.service.rate_limit.test.user.over_limit:") {
		if !lines.Scan() {
			t.Fatalf("USE_STATSD: %v before the over_limit line", lines.Err())
		}
	}
}

// TestBadInputTouchesNoRedis: requests refused as invalid (gRPC and /json)
// are refused before any state is touched: Redis runs no FCALL for them.
func TestBadInputTouchesNoRedis(t *testing.T) {
	r := redistest.Single(t)
	p := startServeEnv(t, buildCharon(t), nil, "--config", writeRedisConfig(t), "--store", "redis",
		"--redis-url", "redis://"+r.Addr(), "--max-descriptors", "4")
	if _, err := redistest.CLI(r.Port, "config", "resetstat"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	entry := []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "bad"}}
	many := make([]*ratelimitv3.RateLimitDescriptor, 5)
	for i := range many {
		many[i] = &ratelimitv3.RateLimitDescriptor{Entries: entry}
	}
	for name, req := range map[string]*rlsv3.RateLimitRequest{
		"no domain":      {Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: entry}}},
		"no descriptor":  {Domain: "test"},
		"empty entries":  {Domain: "test", Descriptors: []*ratelimitv3.RateLimitDescriptor{{}}},
		"too many":       {Domain: "test", Descriptors: many},
		"bad limit unit": {Domain: "test", Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: entry, Limit: &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: 99}}}},
	} {
		if _, err := p.rls.ShouldRateLimit(ctx, req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
	resp, err := http.Post("http://"+p.httpAddr+"/json", "application/json", strings.NewReader(`{"domain": 3}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("/json with bad JSON: %d, want 400", resp.StatusCode)
	}
	stats, err := redistest.CLI(r.Port, "info", "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{"cmdstat_fcall", "cmdstat_fcall_ro", "cmdstat_set", "cmdstat_eval"} {
		if strings.Contains(stats, cmd+":") {
			t.Errorf("invalid requests ran %s:\n%s", cmd, stats)
		}
	}
	// And a valid one does run the function (the check above is not blind).
	p.mustOK(t, "user", "good")
	if stats, _ := redistest.CLI(r.Port, "info", "commandstats"); !strings.Contains(stats, "cmdstat_fcall:") {
		t.Errorf("a valid request ran no FCALL:\n%s", stats)
	}
}
