package rls

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/server"
	"github.com/charonlimit/charon/tiers"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestShadowModeAndHeaderNames: envoyproxy/ratelimit's SHADOW_MODE answers
// OK where the answer would be OVER_LIMIT, the status keeping its code, and
// counts it; its LIMIT_*_HEADER names rename the headers.
func TestShadowModeAndHeaderNames(t *testing.T) {
	s, stop := newTestServer(t, Options{ShadowMode: true, ResponseHeaders: true,
		HeaderNames: [3]string{"X-Limit", "", "X-Reset"}}, server.Options{})
	defer stop()
	c := rlsv3.NewRateLimitServiceClient(dial(t, s.GRPCAddr()))
	resp, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("k", "over")}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("shadow mode: overall %v, status %v; want OK, OVER_LIMIT", resp.OverallCode, resp.Statuses[0].Code)
	}
	var names []string
	for _, h := range resp.ResponseHeadersToAdd {
		names = append(names, h.Key)
	}
	if strings.Join(names, ",") != "X-Limit,RateLimit-Remaining,X-Reset" {
		t.Errorf("header names %v", names)
	}
	if got := metricValue(t, s.svc.metrics.globalShadow); got != 1 {
		t.Errorf("charon_global_shadow_mode_total = %v, want 1", got)
	}
}

// TestNearLimitRatio: NEAR_LIMIT_RATIO moves the near_limit threshold.
func TestNearLimitRatio(t *testing.T) {
	for _, tc := range []struct {
		ratio float64
		want  string
	}{
		// The first descriptor uses 0 of 10, the second 1, "near" 9.
		{0, `charon_rate_limit_near_limit{domain="d",key="d.k"} 1`},
		{0.05, `charon_rate_limit_near_limit{domain="d",key="d.k"} 2`},
	} {
		s, stop := newTestServer(t, Options{NearLimitRatio: tc.ratio}, server.Options{})
		c := rlsv3.NewRateLimitServiceClient(dial(t, s.GRPCAddr()))
		if _, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("k", "a"), desc("k", "b"), desc("k", "near")}}); err != nil {
			t.Fatal(err)
		}
		body, _ := get(t, "http://"+s.DebugAddr()+"/metrics")
		if !strings.Contains(body, tc.want) {
			t.Errorf("ratio %v: /metrics lacks %s:\n%s", tc.ratio, tc.want, grepLines(body, "near_limit"))
		}
		stop()
	}
}

// TestLyftMetricNames: with LyftMetrics, each descriptor is counted under
// envoyproxy/ratelimit's Prometheus names and labels too, and its service
// metrics are there.
func TestLyftMetricNames(t *testing.T) {
	s, stop := newTestServer(t, Options{LyftMetrics: true}, server.Options{})
	defer stop()
	c := rlsv3.NewRateLimitServiceClient(dial(t, s.GRPCAddr()))
	for _, v := range []string{"a", "over"} {
		if _, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("k", v)}}); err != nil {
			t.Fatal(err)
		}
	}
	c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("k", "bad")}})
	body, _ := get(t, "http://"+s.DebugAddr()+"/metrics")
	for _, want := range []string{
		`ratelimit_service_rate_limit_total_hits{domain="d",key1="k",key2=""} 2`,
		`ratelimit_service_rate_limit_over_limit{domain="d",key1="k",key2=""} 1`,
		`ratelimit_service_rate_limit_within_limit{domain="d",key1="k",key2=""} 1`,
		`charon_rate_limit_total_hits{domain="d",key="d.k"} 2`,
		`ratelimit_service_total_requests{grpc_method="ShouldRateLimit"} 3`,
		`ratelimit_service_should_rate_limit_error{err_type="service_error"} 1`,
		`ratelimit_service_response_time_seconds_count{grpc_method="ShouldRateLimit"} 3`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	for key, want := range map[string][3]string{
		"edge.path_/login.remote_address": {"edge", "path_/login", "remote_address"},
		"edge.remote_address":             {"edge", "remote_address", ""},
		"d.a.b.c.d":                       {"d", "a", "b"},
	} {
		if got := lyftLabels(key); got != want {
			t.Errorf("lyftLabels(%s) = %v, want %v", key, got, want)
		}
	}
}

// TestMetricsListener: MetricsAddr serves the metrics alone, at MetricsPath.
func TestMetricsListener(t *testing.T) {
	s, stop := newTestServer(t, Options{}, server.Options{MetricsAddr: "127.0.0.1:0", MetricsPath: "/stats"})
	defer stop()
	if body, code := get(t, "http://"+s.MetricsAddr()+"/stats"); code != 200 || !strings.Contains(body, "charon_request_duration_seconds") {
		t.Errorf("/stats: %d", code)
	}
	if _, code := get(t, "http://"+s.MetricsAddr()+"/rlconfig"); code != 404 {
		t.Errorf("/rlconfig on the metrics listener: %d, want 404", code)
	}
}

// TestHitsAddendZeroIsACheck: a descriptor's hits_addend set to 0 is a
// check, as in envoyproxy/ratelimit: OK with what remains, consuming nothing.
func TestHitsAddendZeroIsACheck(t *testing.T) {
	s := engineServer(t, "d", Options{}, server.Options{}, &descriptors.Node{Key: "user", Limit: &descriptors.Limit{Policy: perMinute(1)}})
	c := rlsv3.NewRateLimitServiceClient(dial(t, s.GRPCAddr()))
	ask := func(hits *wrapperspb.UInt64Value) *rlsv3.RateLimitResponse_DescriptorStatus {
		t.Helper()
		d := desc("user", "u")
		d.HitsAddend = hits
		resp, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Statuses[0]
	}
	for i, step := range []struct {
		hits      *wrapperspb.UInt64Value
		code      rlsv3.RateLimitResponse_Code
		remaining uint32
	}{
		{wrapperspb.UInt64(0), rlsv3.RateLimitResponse_OK, 1},
		{nil, rlsv3.RateLimitResponse_OK, 0},
		{wrapperspb.UInt64(0), rlsv3.RateLimitResponse_OK, 0},
		{nil, rlsv3.RateLimitResponse_OVER_LIMIT, 0},
	} {
		if got := ask(step.hits); got.Code != step.code || got.LimitRemaining != step.remaining {
			t.Errorf("step %d (hits_addend %v): %v remaining %d, want %v remaining %d", i, step.hits, got.Code, got.LimitRemaining, step.code, step.remaining)
		}
	}
}

// TestDynamicMetadata: envoyproxy/ratelimit's dynamic_metadata: the domain,
// each descriptor's entries, limit and hits_addend, the request's
// hits_addend, and the metadata of the descriptors that passed.
func TestDynamicMetadata(t *testing.T) {
	one := perMinute(1)
	s := engineServer(t, "d", Options{DynamicMetadata: true, ShadowMode: true}, server.Options{},
		&descriptors.Node{Key: "a", Limit: &descriptors.Limit{Policy: one, Metadata: map[string]any{"team": "a", "n": map[string]any{"x": 1}}}},
		&descriptors.Node{Key: "b", Limit: &descriptors.Limit{Policy: one, Metadata: map[string]any{"team": "b", "n": map[string]any{"y": 2}}}},
		&descriptors.Node{Key: "c", Limit: &descriptors.Limit{Policy: one, Metadata: map[string]any{"gone": true}}})
	c := rlsv3.NewRateLimitServiceClient(dial(t, s.GRPCAddr()))
	ask := func() *structpb.Struct {
		t.Helper()
		d := desc("b", "2")
		d.HitsAddend = wrapperspb.UInt64(1)
		resp, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d", HitsAddend: 1,
			Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a", "1"), d, desc("c", "3"), desc("zz", "9")}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.DynamicMetadata
	}
	ask() // c (and the others) now used their one hit
	st2 := ask()
	got, _ := protojson.Marshal(st2)
	var v map[string]any
	json.Unmarshal(got, &v)
	if v["domain"] != "d" || v["hitsAddend"] != float64(1) {
		t.Errorf("domain, hitsAddend: %s", got)
	}
	ds, _ := v["descriptors"].([]any)
	if len(ds) != 4 || fmt.Sprint(ds[0].(map[string]any)["entries"]) != "[a=1]" || ds[1].(map[string]any)["hitsAddend"] != float64(1) {
		t.Errorf("descriptors: %s", got)
	}
	// All over: nothing passed, no metadata.
	if _, ok := v["metadata"]; ok {
		t.Errorf("metadata of descriptors over their limit: %s", got)
	}

	// Fresh values pass: their metadata is merged, the first one's winning.
	resp, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a", "new"), desc("b", "new")}})
	if err != nil {
		t.Fatal(err)
	}
	got, _ = protojson.Marshal(resp.DynamicMetadata.GetFields()["metadata"])
	v = nil
	json.Unmarshal(got, &v)
	if v["team"] != "a" || fmt.Sprint(v["n"]) != "map[x:1 y:2]" {
		t.Errorf("merged metadata: %s, want team a (first wins) and n merged", got)
	}
}

type recordingSink struct {
	mu     sync.Mutex
	counts map[string]int64
	timed  int
}

func (r *recordingSink) Count(name string, n int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.counts == nil {
		r.counts = map[string]int64{}
	}
	r.counts[name] += n
}

func (r *recordingSink) Timing(string, time.Duration) {
	r.mu.Lock()
	r.timed++
	r.mu.Unlock()
}

// TestStatsdStats: SendStats emits envoyproxy/ratelimit's statsd stats with
// its names.
func TestStatsdStats(t *testing.T) {
	sink := &recordingSink{}
	s, stop := newTestServer(t, Options{Stats: sink}, server.Options{})
	defer stop()
	c := rlsv3.NewRateLimitServiceClient(dial(t, s.GRPCAddr()))
	for _, v := range []string{"a", "over", "bad"} {
		c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("k", v)}})
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	for name, want := range map[string]int64{
		"ratelimit.service.rate_limit.d.k.total_hits":            2,
		"ratelimit.service.rate_limit.d.k.over_limit":            1,
		"ratelimit.service.rate_limit.d.k.within_limit":          1,
		"ratelimit_server.ShouldRateLimit.total_requests":        3,
		"ratelimit.service.call.should_rate_limit.service_error": 1,
	} {
		if got := sink.counts[name]; got != want {
			t.Errorf("%s = %d, want %d", name, got, want)
		}
	}
	if sink.timed != 3 {
		t.Errorf("%d response times, want 3", sink.timed)
	}
}

// engineServer serves an engine on the memory store with one domain of
// nodes (stopped when the test ends).
func engineServer(t *testing.T, domain string, opts Options, so server.Options, nodes ...*descriptors.Node) *testServer {
	t.Helper()
	st := memstore.New(memstore.Options{})
	t.Cleanup(func() { st.Close() })
	eng := engine.New(engine.Options{Store: st})
	tree, err := descriptors.NewTree([]descriptors.DomainSpec{{Config: descriptors.DomainConfig{Name: domain}, Nodes: nodes}})
	if err != nil {
		t.Fatal(err)
	}
	eng.SetTree(tree)
	so.Engine = eng
	s, stop := newTestServer(t, opts, so)
	t.Cleanup(stop)
	return s
}

// perMinute is a sliding window of n hits per minute.
func perMinute(n int64) *tiers.Policy {
	return &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: n, Window: time.Minute, Active: tiers.Unbounded}}}
}

// TestStatKey: stat names are envoyproxy/ratelimit's (SanitizeStatName: ':',
// '|' and an IPv4 address's dots written '_'), with line breaks and bytes
// that are not UTF-8 made harmless too.
func TestStatKey(t *testing.T) {
	for _, tc := range []struct{ key, want string }{
		{"edge.path_/login", "edge.path_/login"},
		{"edge.remote_address_10.0.0.1", "edge.remote_address_10_0_0_1"},
		{"eg.route_route.masked_remote_address_0.0.0.0/0", "eg.route_route.masked_remote_address_0_0_0_0/0"},
		{"d.ip_1234.5.6.78.x", "d.ip_1234_5_6_78.x"},
		{"d.v_1.2.3", "d.v_1.2.3"},
		{"d.host_[::1]:80|x", "d.host_[__1]_80_x"},
		{"d.k_a\nfoo:1|c", "d.k_a_foo_1_c"},
		{"d.k_\xff", "d.k_%FF"},
	} {
		if got := statKey(tc.key); got != tc.want {
			t.Errorf("statKey(%q) = %q, want %q", tc.key, got, tc.want)
		}
	}
}

// TestGlobalShadowAndDomainNotFoundStats: envoyproxy/ratelimit's
// ratelimit.service.global_shadow_mode counts the requests SHADOW_MODE
// answered OK, and ratelimit.service.rate_limit.DOMAIN.domain_not_found the
// descriptors of requests for a domain with no configuration (at most
// maxNotFoundDomains domains by name, then ~other).
func TestGlobalShadowAndDomainNotFoundStats(t *testing.T) {
	sink := &recordingSink{}
	s := engineServer(t, "d", Options{Stats: sink, LyftMetrics: true, ShadowMode: true}, server.Options{},
		&descriptors.Node{Key: "user", Limit: &descriptors.Limit{Policy: perMinute(1)}})
	c := rlsv3.NewRateLimitServiceClient(dial(t, s.GRPCAddr()))
	ask := func(domain string, ds ...*ratelimitv3.RateLimitDescriptor) {
		t.Helper()
		resp, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds})
		if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("%s: %v, %v; want OK", domain, resp.GetOverallCode(), err)
		}
	}
	for range 3 {
		ask("d", desc("user", "u")) // the 2nd and 3rd are over, answered OK
	}
	ask("nowhere", desc("user", "u"), desc("user", "v"))
	ask("nowhere", desc("user", "u"))
	ask("10.0.0.1:80", desc("user", "u"))
	for i := range maxNotFoundDomains {
		ask(fmt.Sprintf("x%d", i), desc("user", "u"))
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	for name, want := range map[string]int64{
		"ratelimit.service.global_shadow_mode":                      2,
		"ratelimit.service.rate_limit.d.user.over_limit":            2,
		"ratelimit.service.rate_limit.nowhere.domain_not_found":     3,
		"ratelimit.service.rate_limit.10_0_0_1_80.domain_not_found": 1,
		"ratelimit.service.rate_limit.x0.domain_not_found":          1,
		"ratelimit.service.rate_limit.~other.domain_not_found":      2, // x254, x255
		"ratelimit.service.rate_limit.d.domain_not_found":           0,
	} {
		if got := sink.counts[name]; got != want {
			t.Errorf("%s = %d, want %d", name, got, want)
		}
	}
	if got := metricValue(t, s.svc.metrics.lyftNames().globalShadow); got != 2 {
		t.Errorf("ratelimit_service_global_shadow_mode = %v, want 2", got)
	}
	if got := metricValue(t, s.svc.metrics.globalShadow); got != 2 {
		t.Errorf("charon_global_shadow_mode_total = %v, want 2", got)
	}
}

// TestNotFoundNamesBounded: unknown domains come from requests; past the
// bound they share one name and are not kept.
func TestNotFoundNamesBounded(t *testing.T) {
	var f notFoundNames
	for i := range 10 * maxNotFoundDomains {
		f.name(fmt.Sprint("d", i))
	}
	kept := 0
	f.seen.Range(func(any, any) bool { kept++; return true })
	if kept != maxNotFoundDomains {
		t.Errorf("%d domains kept, want %d", kept, maxNotFoundDomains)
	}
	if got := f.name("d999999"); got != otherNotFound {
		t.Errorf("a domain past the bound: %q, want %q", got, otherNotFound)
	}
}
