package server

import (
	"context"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestShadowModeAndHeaderNames: envoyproxy/ratelimit's SHADOW_MODE answers
// OK where the answer would be OVER_LIMIT, the status keeping its code, and
// counts it; its LIMIT_*_HEADER names rename the headers.
func TestShadowModeAndHeaderNames(t *testing.T) {
	s, stop := newTestServer(t, Options{ShadowMode: true, ResponseHeaders: true,
		HeaderNames: [3]string{"X-Limit", "", "X-Reset"}})
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
	if got := metricValue(t, s.metrics.globalShadow); got != 1 {
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
		s, stop := newTestServer(t, Options{NearLimitRatio: tc.ratio})
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
