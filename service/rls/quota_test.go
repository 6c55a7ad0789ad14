package rls

import (
	"io"
	"log/slog"
	"testing"
	"testing/fstest"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/internal/store/memstore"
)

// TestQuotaAnswer: an RLS answer whose descriptor has a calendar quota
// says in its dynamic metadata and headers which limit decided and when the
// quota's period ends (the next midnight in Paris), and its RateLimit-Reset
// counts to that boundary when the quota rejects.
func TestQuotaAnswer(t *testing.T) {
	const text = `domain: api
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 5}
    quota: {limit: 2, period: day, time_zone: Europe/Paris}
`
	cfg, _, err := config.Load(fstest.MapFS{"api.yaml": {Data: []byte(text)}}, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	st := memstore.New(memstore.Options{})
	defer st.Close()
	now := time.Date(2030, 6, 1, 21, 0, 0, 0, time.UTC) // 23:00 in Paris
	eng := engine.New(engine.Options{Store: st, Now: func() time.Time { return now }})
	eng.SetTree(cfg.Tree)
	s := &Service{engine: eng, metrics: testMetrics(t), log: slog.New(slog.NewTextHandler(io.Discard, nil)), responseHeaders: true,
		headerNames: [3]string{"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"}}
	tenant := desc("tenant", "acme")
	ask(t, s, tenant)
	resp := ask(t, s, tenant)
	if resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("second request: %v", resp.OverallCode)
	}
	resp = ask(t, s, tenant)
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("third request: %v, want OVER_LIMIT", resp.OverallCode)
	}
	want := map[string]any{"descriptor": 0.0, "by": "quota", "period_end": "2030-06-01T22:00:00Z", "used": 2.0, "remaining": 0.0, "limit": 2.0}
	if diff := cmp.Diff(want, resp.GetDynamicMetadata().GetFields()[QuotaKey].GetStructValue().AsMap()); diff != "" {
		t.Errorf("dynamic metadata (-want +got):\n%s", diff)
	}
	wantHeaders := []*corev3.HeaderValue{
		{Key: "RateLimit-Limit", Value: "2"}, {Key: "RateLimit-Remaining", Value: "0"}, {Key: "RateLimit-Reset", Value: "3600"},
		{Key: HeaderLimitKind, Value: "quota"}, {Key: HeaderQuotaRemaining, Value: "0"}, {Key: HeaderQuotaReset, Value: "2030-06-01T22:00:00Z"},
	}
	if diff := cmp.Diff(wantHeaders, resp.ResponseHeadersToAdd, protocmp.Transform()); diff != "" {
		t.Errorf("headers (-want +got):\n%s", diff)
	}
	if got := resp.Statuses[0].GetDurationUntilReset().AsDuration(); got != time.Hour {
		t.Errorf("duration_until_reset %v, want 1h (midnight in Paris)", got)
	}
}
