package main

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	xdsserver "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
)

// quietLog is go-control-plane's logger, silent.
type quietLog struct{}

func (quietLog) Debugf(string, ...any) {}
func (quietLog) Infof(string, ...any)  {}
func (quietLog) Warnf(string, ...any)  {}
func (quietLog) Errorf(string, ...any) {}

// startXDSServer serves go-control-plane's ADS over a snapshot cache on a
// loopback port; the test's cleanup stops it.
func startXDSServer(t *testing.T) (addr string, snapshots cache.SnapshotCache) {
	t.Helper()
	snapshots = cache.NewSnapshotCache(true, cache.IDHash{}, quietLog{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	srv := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(srv, xdsserver.NewServer(ctx, snapshots, nil))
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		cancel()
		<-done
	})
	return lis.Addr().String(), snapshots
}

// setRLSConfig publishes version for node: domain "xds", key "user", n a
// minute.
func setRLSConfig(t *testing.T, snapshots cache.SnapshotCache, node, version string, n uint32) {
	t.Helper()
	c := &rlsconfv3.RateLimitConfig{Name: "users", Domain: "xds", Descriptors: []*rlsconfv3.RateLimitDescriptor{
		{Key: "user", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: n}},
	}}
	snap, err := cache.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: {c}})
	if err != nil {
		t.Fatal(err)
	}
	if err := snapshots.SetSnapshot(context.Background(), node, snap); err != nil {
		t.Fatal(err)
	}
}

// askUser sends one request for domain xds, user=name.
func askUser(t *testing.T, p *proc, name string) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := p.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "xds",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: name}}}}})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v\n%s", err, p.stderr.String())
	}
	return resp
}

// TestServeXDSProcess runs the binary with envoyproxy/ratelimit's
// CONFIG_TYPE=GRPC_XDS_SOTW environment: it turns healthy once the xDS
// server's snapshot is in force, answers from it, names its version in
// /rlconfig and the metrics, and takes an update.
func TestServeXDSProcess(t *testing.T) {
	bin := buildCharon(t)
	addr, snapshots := startXDSServer(t)
	setRLSConfig(t, snapshots, "rl-node", "v1", 2)
	p := startServeEnv(t, bin, []string{"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL=" + addr,
		"CONFIG_GRPC_XDS_NODE_ID=rl-node", "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL=10ms", "XDS_CLIENT_BACKOFF_MAX_INTERVAL=100ms"})
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		if got := askUser(t, p, "alice").GetOverallCode(); got != want {
			t.Errorf("request %d under v1 (2 a minute): %v, want %v", i+1, got, want)
		}
	}
	if l := askUser(t, p, "bob").GetStatuses()[0].GetCurrentLimit(); l.GetRequestsPerUnit() != 2 || l.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE {
		t.Errorf("current_limit %v, want 2 per MINUTE", l)
	}
	// A rule from xDS is named by its resource, not by a line of the file
	// written from it.
	if body := get(t, "http://"+p.debugAddr+"/rlconfig"); !strings.HasPrefix(body, "# source: xds, version: \"v1\"\n") || !strings.Contains(body, "domain: xds") ||
		!strings.Contains(body, "source: users\n") {
		t.Errorf("/rlconfig:\n%s", body)
	}
	if n := metricValue(get(t, "http://"+p.debugAddr+"/metrics"), `charon_config_version_info{source="xds",version="v1"}`); n != 1 {
		t.Errorf("charon_config_version_info of v1: %v, want 1", n)
	}

	setRLSConfig(t, snapshots, "rl-node", "v2", 100)
	deadline := time.Now().Add(20 * time.Second)
	for askUser(t, p, "carol").GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != 100 {
		if time.Now().After(deadline) {
			t.Fatalf("v2 not in force in time\n%s", p.stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := metricValue(get(t, "http://"+p.debugAddr+"/metrics"), `charon_config_reloads_total{result="success"}`); n != 2 {
		t.Errorf("charon_config_reloads_total success: %v, want 2", n)
	}
	p.stop(t)
}

// TestServeXDSForceStart: with FORCE_START_WITHOUT_INITIAL_CONFIG=true and
// no snapshot yet, the process is healthy at once and serves with no
// domains; the first snapshot then applies.
func TestServeXDSForceStart(t *testing.T) {
	bin := buildCharon(t)
	addr, snapshots := startXDSServer(t)
	p := startServeEnv(t, bin, []string{"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL=" + addr,
		"FORCE_START_WITHOUT_INITIAL_CONFIG=true"})
	if resp := askUser(t, p, "alice"); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetCurrentLimit() != nil {
		t.Errorf("before any configuration: %v, want OK with no limit", resp)
	}
	setRLSConfig(t, snapshots, "default", "1", 1)
	deadline := time.Now().Add(20 * time.Second)
	for askUser(t, p, "bob").GetStatuses()[0].GetCurrentLimit() == nil {
		if time.Now().After(deadline) {
			t.Fatalf("the first snapshot not in force in time\n%s", p.stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	p.stop(t)
}

// TestXDSMonthlyBudgetCalendarUnits: over xDS, which can only send units,
// --calendar-units makes a monthly budget (Envoy Gateway's, AI Gateway's)
// a calendar month of the zone: 3 a month, the fourth refused until the
// 1st of the next month at midnight UTC (not 30 days on), on the memory
// store, a single Redis and a Redis Cluster; the limit is reported as 3
// per MONTH.
func TestXDSMonthlyBudgetCalendarUnits(t *testing.T) {
	bin := buildCharon(t)
	for _, st := range everyStore() {
		t.Run(st.name, func(t *testing.T) {
			addr, snapshots := startXDSServer(t)
			c := &rlsconfv3.RateLimitConfig{Name: "budgets", Domain: "xds", Descriptors: []*rlsconfv3.RateLimitDescriptor{
				// MONTH (5) is newer than the generated enum.
				{Key: "user", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: 5, RequestsPerUnit: 3}},
			}}
			snap, err := cache.NewSnapshot("v1", map[resource.Type][]types.Resource{resource.RateLimitConfigType: {c}})
			if err != nil {
				t.Fatal(err)
			}
			if err := snapshots.SetSnapshot(context.Background(), "rl-node", snap); err != nil {
				t.Fatal(err)
			}
			args := append([]string{"--config-xds", addr, "--config-xds-node-id", "rl-node", "--calendar-units", "UTC", "--redis-timeout", "5s"}, st.args(t)...)
			p := startServe(t, bin, args...)
			for i := range 3 {
				if got := askUser(t, p, "alice").GetOverallCode(); got != rlsv3.RateLimitResponse_OK {
					t.Fatalf("request %d of 3 a month: %v", i+1, got)
				}
			}
			resp := askUser(t, p, "alice")
			now := time.Now().UTC()
			next := time.Date(now.Year(), now.Month()+1, 1, 0, 0, 0, 0, time.UTC)
			st := resp.GetStatuses()[0]
			reset := st.GetDurationUntilReset().AsDuration()
			if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || reset <= 0 || (next.Sub(now)-reset).Abs() > 10*time.Second {
				t.Errorf("the fourth: %v, reset after %v; want OVER_LIMIT until the 1st (%v)", resp.GetOverallCode(), reset, next.Sub(now))
			}
			if l := st.GetCurrentLimit(); l.GetRequestsPerUnit() != 3 || l.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MONTH {
				t.Errorf("current_limit %v, want 3 per MONTH", l)
			}
			p.stop(t)
		})
	}
}
