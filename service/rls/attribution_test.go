package rls

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/internal/offenders"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/server"
	"github.com/charonlimit/charon/tiers"
)

const attributionConfig = `domain: api
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 2, name: per-user}
  - key: path
    value: /login
    descriptors:
      - key: remote_address
        rate_limit: {unit: minute, requests_per_unit: 1}
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 1}
    shadow_mode: true
`

// attributionRLS is an rls over a real engine of attributionConfig, at a
// fixed instant.
func attributionRLS(t *testing.T, mode Attribution, headers, lyft bool) (*Service, *offenders.Tracker) {
	t.Helper()
	cfg, _, err := config.Load(fstest.MapFS{"api.yaml": {Data: []byte(attributionConfig)}}, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	st := memstore.New(memstore.Options{})
	t.Cleanup(func() { st.Close() })
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	eng := engine.New(engine.Options{Store: st, Now: func() time.Time { return now }})
	eng.SetTree(cfg.Tree)
	s := New(eng, withTop(Options{Attribution: mode, AttributionHeaders: headers, DynamicMetadata: lyft}, time.Hour))
	s.metrics, s.observers = testMetrics(t), []Observer{topObserver{s.top}}
	return s, s.top
}

func ask(t *testing.T, s *Service, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api", Descriptors: ds})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := proto.Marshal(resp); err != nil {
		t.Fatalf("the response does not marshal: %v", err)
	}
	return resp
}

func charonMetadata(resp *rlsv3.RateLimitResponse) map[string]any {
	v, ok := resp.GetDynamicMetadata().GetFields()[AttributionKey]
	if !ok {
		return nil
	}
	return v.GetStructValue().AsMap()
}

// TestAttribution: a rejected answer names the rule's file and line, its
// name, the resource, the tier and the retry time; grants are attributed
// only when asked; a shadow rejection is attributed as such.
func TestAttribution(t *testing.T) {
	s, _ := attributionRLS(t, AttributionLimited, true, false)
	user := desc("user", "alice")
	for range 2 {
		if resp := ask(t, s, user); charonMetadata(resp) != nil || len(resp.ResponseHeadersToAdd) != 0 {
			t.Errorf("a grant is attributed under limited: %v", resp)
		}
	}
	resp := ask(t, s, user)
	want := map[string]any{"code": "OVER_LIMIT", "descriptor": 0.0, "rule": "api.yaml:3", "name": "per-user",
		"resource": "api/user", "tier": 1.0, "limit": "2 per second", "limited_by": "tier", "retry_after": 1.0}
	if diff := cmp.Diff(want, charonMetadata(resp)); diff != "" {
		t.Errorf("rejection's attribution (-want +got):\n%s", diff)
	}
	wantHeaders := []*corev3.HeaderValue{{Key: HeaderRule, Value: "api.yaml:3"}, {Key: HeaderRuleName, Value: "per-user"},
		{Key: HeaderResource, Value: "api/user"}, {Key: HeaderTier, Value: "1"}, {Key: HeaderRetryAfter, Value: "1"}}
	if diff := cmp.Diff(wantHeaders, resp.ResponseHeadersToAdd, protocmp.Transform()); diff != "" {
		t.Errorf("headers (-want +got):\n%s", diff)
	}

	// Two descriptors: the one that rejected is named.
	login := desc("path", "/login", "remote_address", "10.0.0.1")
	ask(t, s, login)
	resp = ask(t, s, desc("user", "bob"), login)
	if got := charonMetadata(resp); got["rule"] != "api.yaml:8" || got["descriptor"] != 1.0 || got["resource"] != "api/path=%2Flogin/remote_address" {
		t.Errorf("second descriptor rejected: attribution %v", got)
	}

	tenant := desc("tenant", "t1")
	ask(t, s, tenant)
	resp = ask(t, s, tenant)
	if got := charonMetadata(resp); resp.OverallCode != rlsv3.RateLimitResponse_OK || got["shadow"] != true || got["code"] != "OK" || got["rule"] != "api.yaml:10" {
		t.Errorf("shadow rejection: %v, attribution %v", resp.OverallCode, got)
	}

	all, _ := attributionRLS(t, AttributionAll, false, false)
	resp = ask(t, all, user)
	if diff := cmp.Diff(map[string]any{"code": "OK", "descriptor": 0.0, "rule": "api.yaml:3", "name": "per-user",
		"resource": "api/user", "tier": 1.0, "limit": "2 per second"}, charonMetadata(resp)); diff != "" || len(resp.ResponseHeadersToAdd) != 0 {
		t.Errorf("grant under all (-want +got):\n%s\nheaders %v", diff, resp.ResponseHeadersToAdd)
	}
	off, _ := attributionRLS(t, AttributionOff, true, false)
	for range 3 {
		if resp := ask(t, off, user); resp.DynamicMetadata != nil || len(resp.ResponseHeadersToAdd) != 0 {
			t.Errorf("attributed while off: %v", resp)
		}
	}
}

// TestAttributionBesideLyftMetadata: with --dynamic-metadata,
// envoyproxy/ratelimit's fields stay as they are, Charon's beside them.
func TestAttributionBesideLyftMetadata(t *testing.T) {
	s, _ := attributionRLS(t, AttributionLimited, false, true)
	user := desc("user", "alice")
	ask(t, s, user)
	ask(t, s, user)
	f := ask(t, s, user).GetDynamicMetadata().GetFields()
	var keys []string
	for k := range f {
		keys = append(keys, k)
	}
	if diff := cmp.Diff([]string{"charon", "descriptors", "domain"}, keys, cmpSorted); diff != "" {
		t.Errorf("dynamic metadata fields (-want +got):\n%s", diff)
	}
	if f["domain"].GetStringValue() != "api" || f["charon"].GetStructValue().GetFields()["rule"].GetStringValue() != "api.yaml:3" {
		t.Errorf("dynamic metadata %v", f)
	}
}

var cmpSorted = cmp.Transformer("sort", func(in []string) []string {
	out := append([]string(nil), in...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
})

// TestAttributionBounded: whatever the rule's file, name and resource, the
// attribution holds printable ASCII only and stays under 1.2 KiB, in
// metadata and in headers.
func TestAttributionBounded(t *testing.T) {
	for _, tc := range []struct{ name, file, rule, resource string }{
		{"plain", "a.yaml", "r", "a/user"},
		{"long", strings.Repeat("f", 5000), strings.Repeat("n", 5000), strings.Repeat("r", 5000)},
		{"not ASCII", "caf\xe9.yaml", "règle\r\n", "a/%FF"},
		{"long, not ASCII", strings.Repeat("é", 3000), strings.Repeat("\xff", 3000), strings.Repeat("✓", 3000)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := &engine.Response{Code: engine.CodeOverLimit, Statuses: []engine.Status{{
				Code: engine.CodeOverLimit, Limit: &engine.CurrentLimit{RequestsPerUnit: 5, Unit: tiers.UnitMinute, Multiplier: 2},
				ResetAfter: time.Second, Decision: tiers.Decision{Tier: 3, RetryAfter: 1500 * time.Microsecond},
				Match: descriptors.Match{Limit: &descriptors.Limit{File: tc.file, Line: 12345, Name: tc.rule}, Resource: tc.resource},
			}}}
			m := attribution(resp, 0)
			b, err := proto.Marshal(m)
			if err != nil || len(b) > 1200 {
				t.Errorf("attribution marshals to %d bytes (%v), want at most 1200", len(b), err)
			}
			if got := m.Fields["retry_after"].GetNumberValue(); got != 0.002 {
				t.Errorf("retry_after %v, want 0.002 (rounded up to the millisecond)", got)
			}
			if got := m.Fields["limit"].GetStringValue(); got != "5 per 2 minute" {
				t.Errorf("limit %q", got)
			}
			n := 0
			for _, h := range attributionHeaders(resp, 0) {
				n += len(h.Key) + len(h.Value)
				for _, c := range []byte(h.Value) {
					if c < 0x20 || c >= 0x7f {
						t.Errorf("header %s holds byte %#x", h.Key, c)
					}
				}
			}
			if n > 1200 {
				t.Errorf("headers of %d bytes, want at most 1200", n)
			}
		})
	}
}

// TestTopEndpoint: three heavy tenants among a thousand light ones are the
// top three rejected values of their rule at /top, and in charon_top_hits.
func TestTopEndpoint(t *testing.T) {
	s, stop := newTestServer(t, withTop(Options{TopMetrics: 3, TopMetricsValues: true}, time.Hour), server.Options{})
	defer stop()
	top := s.svc.top
	l := &descriptors.Limit{File: "tenants.yaml", Line: 4}
	now := time.Now()
	for i := range 20000 {
		es := []descriptors.Entry{{Key: "tenant", Value: "light" + strconv.Itoa(i%1000)}}
		top.Observe(now, "api", l, "api/tenant", es[0].Value, es, 1, offenders.Rejected)
		if i%10 == 0 {
			for h := range 3 {
				v := "heavy" + strconv.Itoa(h)
				top.Observe(now, "api", l, "api/tenant", v, []descriptors.Entry{{Key: "tenant", Value: v}}, uint64(3-h), offenders.Rejected)
			}
		}
	}
	body, code := get(t, "http://"+s.DebugAddr()+"/top?domain=api&n=3")
	if code != 200 {
		t.Fatalf("/top: %d %s", code, body)
	}
	var ans offenders.Answer
	if err := json.Unmarshal([]byte(body), &ans); err != nil {
		t.Fatal(err)
	}
	if len(ans.Rules) != 1 || ans.Rules[0].Rule.Rule != "tenants.yaml:4" {
		t.Fatalf("rules %+v", ans.Rules)
	}
	var got []string
	for _, it := range ans.Rules[0].Rejected.Items {
		got = append(got, it.Value+" "+it.Descriptor)
	}
	if diff := cmp.Diff([]string{"heavy0 tenant=heavy0", "heavy1 tenant=heavy1", "heavy2 tenant=heavy2"}, got); diff != "" {
		t.Errorf("top three (-want +got):\n%s", diff)
	}
	if body, _ := get(t, "http://"+s.DebugAddr()+"/top?domain=other"); !strings.Contains(body, `"rules": []`) {
		t.Errorf("/top of another domain: %s", body)
	}
	metrics, _ := get(t, "http://"+s.DebugAddr()+"/metrics")
	for _, want := range []string{
		`charon_top_hits{domain="api",outcome="rejected",rank="1",rule="tenants.yaml:4",value="heavy0"} 6000`,
		`charon_top_dropped_total 0`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if n := strings.Count(metrics, "charon_top_hits{"); n != 3 {
		t.Errorf("%d charon_top_hits series, want 3 (top 3 of one rule's rejections)", n)
	}
	if body, code := get(t, "http://"+s.DebugAddr()+"/ui/"); code != 200 || !strings.Contains(body, "<title>") {
		t.Errorf("/ui/: %d %.80s", code, body)
	}
}

// TestTopOff: without a tracker there is no /top.
func TestTopOff(t *testing.T) {
	s, stop := newTestServer(t, Options{}, server.Options{})
	defer stop()
	if _, code := get(t, "http://"+s.DebugAddr()+"/top"); code != 404 {
		t.Errorf("/top without a tracker: %d, want 404", code)
	}
}

// BenchmarkTopOffenders measures what the top offenders and the
// attribution add to the server's share of a decision (BenchmarkShouldRateLimit's
// fake engine), on grants: off, tracked, and tracked with every answer
// attributed; over 16 tenants (each keeps its slot) and over 1,024 (with K
// 32, nearly every hit takes the slot of another: the worst case).
func BenchmarkTopOffenders(b *testing.B) {
	for _, tenants := range []int{16, 1024} {
		reqs := make([]*rlsv3.RateLimitRequest, tenants)
		for i := range reqs {
			reqs[i] = &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "u"+strconv.Itoa(i))}}
		}
		for _, bc := range []struct {
			name string
			top  bool
			mode Attribution
		}{{"off", false, AttributionOff}, {"top", true, AttributionOff}, {"top+limited", true, AttributionLimited}, {"top+all", true, AttributionAll}} {
			b.Run(strconv.Itoa(tenants)+"-tenants/"+bc.name, func(b *testing.B) {
				s := &Service{engine: tenantEngine{}, metrics: testMetrics(b), log: slog.New(slog.NewTextHandler(io.Discard, nil)), attribution: bc.mode}
				if bc.top {
					s.observers = []Observer{topObserver{offenders.NewTracker(offenders.Options{})}}
				}
				ctx := context.Background()
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					if _, err := s.ShouldRateLimit(ctx, reqs[i%len(reqs)]); err != nil {
						b.Fatal(err)
					}
					i++
				}
			})
		}
	}
}

// tenantEngine is constEngine with each status's pair named by its first
// value, as a key-only level names it.
type tenantEngine struct{ constEngine }

func (e tenantEngine) ShouldRateLimit(ctx context.Context, req *engine.Request) (*engine.Response, error) {
	resp, _ := e.constEngine.ShouldRateLimit(ctx, req)
	for i := range resp.Statuses {
		resp.Statuses[i].Match.Domain = req.Descriptors[i].Entries[0].Value
		resp.Statuses[i].Match.Resource = "d/user"
	}
	return resp, nil
}

// TestTopThroughDecisions: through ShouldRateLimit on a real engine, three
// heavy tenants among two thousand light ones are exactly the top three
// rejected values of their rule at /top, each with its descriptor; the
// light ones, never over their limit, are not rejected at all.
func TestTopThroughDecisions(t *testing.T) {
	r, _ := attributionRLS(t, AttributionLimited, false, false)
	s, stop := serveService(t, r, server.Options{Engine: r.engine.(server.Engine)})
	defer stop()
	for i := range 6000 {
		// Two hits per light tenant: within its 2 per second.
		if i < 4000 {
			ask(t, r, desc("user", "light-"+strconv.Itoa(i%2000)))
		}
		for h, n := range []int{2, 3, 4} {
			if i%n == 0 && i < 300 {
				ask(t, r, desc("user", "heavy-"+strconv.Itoa(h+1)))
			}
		}
	}
	body, _ := get(t, "http://"+s.DebugAddr()+"/top?domain=api&rule=per-user&n=5")
	var ans offenders.Answer
	if err := json.Unmarshal([]byte(body), &ans); err != nil {
		t.Fatal(err)
	}
	if len(ans.Rules) != 1 {
		t.Fatalf("rules %+v", ans.Rules)
	}
	var got []string
	for _, it := range ans.Rules[0].Rejected.Items {
		got = append(got, it.Value+" "+it.Descriptor+" "+strconv.FormatUint(it.Count, 10))
	}
	// Each heavy tenant is granted its first two hits.
	want := []string{"heavy-1 user=heavy-1 148", "heavy-2 user=heavy-2 98", "heavy-3 user=heavy-3 73"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rejected at /top (-want +got):\n%s", diff)
	}
	if total := ans.Rules[0].Rejected.Total; total != 148+98+73 {
		t.Errorf("%d hits rejected, want only the heavy tenants' %d", total, 148+98+73)
	}
}

// BenchmarkTopOffendersRatio runs the server's share of a decision with and
// without the top offenders in alternating blocks of 256 requests, so that
// both see the same load on a shared machine, and reports each one's ns per
// request and their ratio (top/off), over 16 and 1,024 tenants.
func BenchmarkTopOffendersRatio(b *testing.B) {
	for _, tenants := range []int{16, 1024} {
		b.Run(strconv.Itoa(tenants)+"-tenants", func(b *testing.B) {
			reqs := make([]*rlsv3.RateLimitRequest, tenants)
			for i := range reqs {
				reqs[i] = &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "u"+strconv.Itoa(i))}}
			}
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			off := &Service{engine: tenantEngine{}, metrics: testMetrics(b), log: log}
			on := &Service{engine: tenantEngine{}, metrics: testMetrics(b), log: log, observers: []Observer{topObserver{offenders.NewTracker(offenders.Options{})}}}
			ctx := context.Background()
			var spent [2]time.Duration
			var n [2]int
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				k := (i / 256) % 2
				s := off
				if k == 1 {
					s = on
				}
				start := time.Now()
				if _, err := s.ShouldRateLimit(ctx, reqs[i%len(reqs)]); err != nil {
					b.Fatal(err)
				}
				spent[k] += time.Since(start)
				n[k]++
				i++
			}
			if n[0] > 0 && n[1] > 0 {
				a, t := float64(spent[0])/float64(n[0]), float64(spent[1])/float64(n[1])
				b.ReportMetric(a, "ns-off/op")
				b.ReportMetric(t, "ns-top/op")
				b.ReportMetric(t/a, "top/off")
			}
		})
	}
}

// FuzzAttribution: whatever a rule's file, name and resource hold, the
// attribution marshals, holds printable ASCII only, and stays under 1.2 KiB
// in metadata and in headers.
func FuzzAttribution(f *testing.F) {
	f.Add("api.yaml", 3, "per-user", "api/user")
	f.Add("caf\xe9", 0, strings.Repeat("\xff", 600), strings.Repeat("✓", 400))
	f.Fuzz(func(t *testing.T, file string, line int, name, resource string) {
		resp := &engine.Response{Code: engine.CodeOverLimit, Statuses: []engine.Status{{
			Code: engine.CodeOverLimit, Limit: &engine.CurrentLimit{RequestsPerUnit: 1, Unit: tiers.UnitSecond},
			Decision: tiers.Decision{Tier: 1, RetryAfter: tiers.Unbounded},
			Match:    descriptors.Match{Limit: &descriptors.Limit{File: file, Line: line, Name: name}, Resource: resource},
		}}}
		b, err := proto.Marshal(attribution(resp, 0))
		if err != nil || len(b) > 1200 {
			t.Fatalf("attribution marshals to %d bytes (%v)", len(b), err)
		}
		n := 0
		for _, h := range attributionHeaders(resp, 0) {
			n += len(h.Key) + len(h.Value)
			for _, c := range []byte(h.Value) {
				if c < 0x20 || c >= 0x7f {
					t.Fatalf("header %s holds byte %#x", h.Key, c)
				}
			}
		}
		if n > 1200 {
			t.Fatalf("headers of %d bytes", n)
		}
	})
}
