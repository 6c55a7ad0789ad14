package rls

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/server"
	"github.com/charonlimit/charon/tiers"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// fakeEngine answers by the first entry's value: "over" is OVER_LIMIT,
// "bad" is an InputError, "boom" a plain error, anything else OK with a limit
// of 10 per second and Remaining = 10 - index.
type fakeEngine struct {
	mu    sync.Mutex
	trees int
	reqs  []*engine.Request
}

func (f *fakeEngine) SetTree(*descriptors.Tree) {
	f.mu.Lock()
	f.trees++
	f.mu.Unlock()
}

func (f *fakeEngine) ShouldRateLimit(ctx context.Context, req *engine.Request) (*engine.Response, error) {
	f.mu.Lock()
	f.reqs = append(f.reqs, req)
	f.mu.Unlock()
	resp := &engine.Response{Code: engine.CodeOK}
	for i, d := range req.Descriptors {
		v := ""
		if len(d.Entries) > 0 {
			v = d.Entries[0].Value
		}
		switch v {
		case "bad":
			return nil, &descriptors.InputError{Field: "descriptors[0].entries[0].value", Message: "bad"}
		case "boom":
			return nil, errors.New("boom")
		case "nil":
			return nil, nil
		}
		st := engine.Status{
			Code:       engine.CodeOK,
			Limit:      &engine.CurrentLimit{RequestsPerUnit: 10, Unit: tiers.UnitSecond},
			Remaining:  uint32(10 - i),
			ResetAfter: 1500 * time.Millisecond,
			Match: descriptors.Match{
				Limit:     &descriptors.Limit{},
				MetricKey: req.Domain + "." + d.Entries[0].Key,
			},
		}
		if v == "over" {
			st.Code, st.Remaining = engine.CodeOverLimit, 0
			resp.Code = engine.CodeOverLimit
		}
		if v == "near" {
			st.Remaining = 1
		}
		resp.Statuses = append(resp.Statuses, st)
	}
	return resp, nil
}

// dial connects to addr, in plaintext unless opts give other credentials.
func dial(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	opts = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)
	cc, err := grpc.NewClient("passthrough:///"+addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func desc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func TestShouldRateLimitOverGRPC(t *testing.T) {
	s, stop := newTestServer(t, Options{ResponseHeaders: true}, server.Options{})
	defer stop()
	c := rlsv3.NewRateLimitServiceClient(dial(t, s.GRPCAddr()))
	ctx := context.Background()

	got, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a", "x"), desc("b", "y")}})
	if err != nil {
		t.Fatal(err)
	}
	lim := &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 10, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND}
	want := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
			{Code: rlsv3.RateLimitResponse_OK, CurrentLimit: lim, LimitRemaining: 10, DurationUntilReset: durationpb.New(1500 * time.Millisecond)},
			{Code: rlsv3.RateLimitResponse_OK, CurrentLimit: lim, LimitRemaining: 9, DurationUntilReset: durationpb.New(1500 * time.Millisecond)},
		},
		ResponseHeadersToAdd: rateLimitHeadersWant("10", "9", "2"),
	}
	if d := cmp.Diff(want, got, protocmp.Transform()); d != "" {
		t.Errorf("response (-want +got):\n%s", d)
	}

	got, err = c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a", "over")}})
	if err != nil {
		t.Fatal(err)
	}
	if got.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || got.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("got %v, want OVER_LIMIT", got)
	}

	for _, tc := range []struct {
		value string
		code  codes.Code
	}{{"bad", codes.InvalidArgument}, {"boom", codes.Internal}, {"nil", codes.Internal}} {
		_, err = c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a", tc.value)}})
		if status.Code(err) != tc.code {
			t.Errorf("value %q: got %v, want code %v", tc.value, err, tc.code)
		}
	}
	_, err = c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a", "bad")}})
	if msg := status.Convert(err).Message(); !strings.Contains(msg, "descriptors[0].entries[0].value") {
		t.Errorf("InvalidArgument message %q does not name the field", msg)
	}

	// Oversized messages are refused by gRPC itself with ResourceExhausted.
	big := desc("k", strings.Repeat("v", server.DefaultMaxRecvMsgSize))
	_, err = c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{big}})
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("oversized: got %v, want ResourceExhausted", err)
	}
}

func rateLimitHeadersWant(limit, remaining, reset string) []*corev3.HeaderValue {
	return []*corev3.HeaderValue{
		{Key: "RateLimit-Limit", Value: limit},
		{Key: "RateLimit-Remaining", Value: remaining},
		{Key: "RateLimit-Reset", Value: reset},
	}
}

func TestConvertRequest(t *testing.T) {
	req := &rlsv3.RateLimitRequest{
		Domain:     "d",
		HitsAddend: 3,
		Descriptors: []*ratelimitv3.RateLimitDescriptor{
			desc("a", "1", "b", "2"),
			{
				Entries:        []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "c"}},
				HitsAddend:     wrapperspb.UInt64(7),
				IsNegativeHits: true,
				Limit: &ratelimitv3.RateLimitDescriptor_RateLimitOverride{
					RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_YEAR, UnitMultiplier: wrapperspb.UInt32(2),
				},
			},
		},
	}
	got, err := toEngineRequest(req)
	if err != nil {
		t.Fatal(err)
	}
	want := &engine.Request{
		Domain: "d",
		Hits:   3,
		Descriptors: []engine.Descriptor{
			{Entries: []descriptors.Entry{{Key: "a", Value: "1"}, {Key: "b", Value: "2"}}},
			{
				Entries: []descriptors.Entry{{Key: "c"}},
				Hits:    7, HasHits: true, Refund: true,
				Override: &engine.Override{RequestsPerUnit: 5, Unit: tiers.UnitYear, Multiplier: 2},
			},
		},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("request (-want +got):\n%s", d)
	}

	for _, tc := range []struct {
		name  string
		o     *ratelimitv3.RateLimitDescriptor_RateLimitOverride
		field string
	}{
		{"unknown unit", &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1}, "descriptors[1].limit.unit"},
		{"out of range unit", &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: 42}, "descriptors[1].limit.unit"},
		{"zero multiplier", &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_SECOND, UnitMultiplier: wrapperspb.UInt32(0)}, "descriptors[1].limit.unit_multiplier"},
	} {
		r := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a", "1"), {Entries: desc("b", "2").Entries, Limit: tc.o}}}
		_, err := toEngineRequest(r)
		var in *descriptors.InputError
		if !errors.As(err, &in) || in.Field != tc.field {
			t.Errorf("%s: got %v, want InputError on %s", tc.name, err, tc.field)
		}
		if status.Code(server.GRPCError(err)) != codes.InvalidArgument {
			t.Errorf("%s: grpcError gives %v, want InvalidArgument", tc.name, server.GRPCError(err))
		}
	}
}

func TestConvertResponse(t *testing.T) {
	resp := &engine.Response{
		Code: 0, // never UNKNOWN, even from a zero Code
		Statuses: []engine.Status{
			{Code: engine.CodeOK, Limit: &engine.CurrentLimit{RequestsPerUnit: 5, Unit: tiers.UnitWeek}, Remaining: 4, ResetAfter: time.Hour},
			{Code: engine.CodeOK, Limit: &engine.CurrentLimit{RequestsPerUnit: 5, Unit: tiers.UnitSecond, Multiplier: 2, Name: "5 per 2s, tier 1"}, Remaining: 2, ResetAfter: 100 * time.Millisecond},
			{Code: engine.CodeOK, Remaining: 0},
			{Code: engine.CodeOK, Limit: &engine.CurrentLimit{RequestsPerUnit: 1, Unit: tiers.UnitMonth}, Remaining: 3},
			{Code: engine.CodeOK, Limit: &engine.CurrentLimit{RequestsPerUnit: 1, Unit: tiers.UnitYear}, Remaining: 3},
		},
	}
	got := toProtoResponse(resp, true, defaultHeaderNames)
	if got.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Errorf("overall code %v, want OK", got.OverallCode)
	}
	units := []rlsv3.RateLimitResponse_RateLimit_Unit{}
	for _, st := range got.Statuses {
		units = append(units, st.GetCurrentLimit().GetUnit())
		if st.DurationUntilReset == nil {
			t.Errorf("status %v has no duration_until_reset", st)
		}
	}
	wantUnits := []rlsv3.RateLimitResponse_RateLimit_Unit{7, 1, 0, 5, 6}
	if d := cmp.Diff(wantUnits, units); d != "" {
		t.Errorf("units (-want +got):\n%s", d)
	}
	if m := got.Statuses[1].CurrentLimit.GetUnitMultiplier().GetValue(); m != 2 || got.Statuses[1].CurrentLimit.Name != "5 per 2s, tier 1" {
		t.Errorf("multiplier %d name %q", m, got.Statuses[1].CurrentLimit.Name)
	}
	// The unlimited status (no current_limit) is skipped; smallest remaining
	// among the limited ones is status 1.
	if d := cmp.Diff(rateLimitHeadersWant("5", "2", "1"), got.ResponseHeadersToAdd, protocmp.Transform()); d != "" {
		t.Errorf("headers (-want +got):\n%s", d)
	}
	if h := toProtoResponse(resp, false, defaultHeaderNames).ResponseHeadersToAdd; h != nil {
		t.Errorf("headers without the option: %v", h)
	}
	over := toProtoResponse(&engine.Response{Code: engine.CodeOverLimit}, false, defaultHeaderNames)
	if over.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("got %v, want OVER_LIMIT", over.OverallCode)
	}
}

type recorder struct {
	header http.Header
	code   int
	body   strings.Builder
}

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = 200
	}
	return r.body.Write(b)
}
func (r *recorder) WriteHeader(c int) { r.code = c }

func get(t *testing.T, url string) (string, int) {
	t.Helper()
	return fetch(t, "GET", url, "", "")
}

func post(t *testing.T, url, body string) (string, int) {
	t.Helper()
	return fetch(t, "POST", url, "", body)
}

// fetch makes an HTTP request and returns the response's body and status
// code. A token goes as a bearer token; a body is sent as JSON.
func fetch(t *testing.T, method, url, token, body string) (string, int) {
	t.Helper()
	return fetchWith(t, &http.Client{Timeout: 10 * time.Second}, method, url, token, body)
}

// fetchWith is fetch with the client hc.
func fetchWith(t *testing.T, hc *http.Client, method, url, token, body string) (string, int) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b), resp.StatusCode
}

func TestJSONEndpoint(t *testing.T) {
	s, stop := newTestServer(t, Options{}, server.Options{})
	defer stop()
	url := "http://" + s.HTTPAddr() + "/json"
	for _, tc := range []struct {
		body     string
		code     int
		contains string
	}{
		{`{"domain":"d","descriptors":[{"entries":[{"key":"a","value":"x"}]}]}`, 200, `"overallCode":"OK"`},
		{`{"domain":"d","descriptors":[{"entries":[{"key":"a","value":"over"}]}]}`, 429, `"overallCode":"OVER_LIMIT"`},
		{`{"domain":"d","descriptors":[{"entries":[{"key":"a","value":"bad"}]}]}`, 400, "descriptors[0].entries[0].value"},
		{`{"domain":`, 400, "invalid RateLimitRequest JSON"},
		{`{"domain":"d","descriptors":[{"entries":[{"key":"a","value":"boom"}]}]}`, 500, "boom"},
	} {
		body, code := post(t, url, tc.body)
		if code != tc.code || !strings.Contains(body, tc.contains) {
			t.Errorf("POST %s: got %d %q, want %d containing %q", tc.body, code, body, tc.code, tc.contains)
		}
	}
	// Another method is told to POST, with a request to copy.
	for _, method := range []string{"GET", "PUT"} {
		req, err := http.NewRequest(method, url, nil)
		must(t, err)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		want := "curl -s -XPOST " + url + ` -d '{"domain":`
		if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "POST" ||
			!strings.HasPrefix(string(b), "POST a RateLimitRequest as JSON") || !strings.Contains(string(b), want) {
			t.Errorf("%s /json: %d, Allow %q, %q; want 405, Allow POST, an example containing %q", method, resp.StatusCode, resp.Header.Get("Allow"), b, want)
		}
	}
}

func TestMetrics(t *testing.T) {
	s, stop := newTestServer(t, Options{}, server.Options{})
	defer stop()
	c := rlsv3.NewRateLimitServiceClient(dial(t, s.GRPCAddr()))
	ctx := context.Background()
	for _, v := range []string{"x", "over", "near", "bad"} {
		c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "dom", HitsAddend: 2, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("k", v)}})
	}
	body, code := get(t, "http://"+s.DebugAddr()+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	for _, want := range []string{
		`charon_rate_limit_total_hits{domain="dom",key="dom.k"} 6`,
		`charon_rate_limit_over_limit{domain="dom",key="dom.k"} 2`,
		`charon_rate_limit_within_limit{domain="dom",key="dom.k"} 4`,
		`charon_rate_limit_near_limit{domain="dom",key="dom.k"} 2`,
		`charon_invalid_requests_total 1`,
		`charon_request_duration_seconds_count 4`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if _, code := get(t, "http://"+s.DebugAddr()+"/rlconfig"); code != http.StatusServiceUnavailable {
		t.Errorf("/rlconfig with no config: %d, want 503", code)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func testCounter(t *testing.T, m *server.Metrics, result string) float64 {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "charon_config_reloads_total" {
			continue
		}
		for _, mm := range mf.GetMetric() {
			for _, lp := range mm.GetLabel() {
				if lp.GetName() == "result" && lp.GetValue() == result {
					return mm.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// BenchmarkShouldRateLimit measures the server's own share of a decision:
// conversion both ways and metrics, over a fake engine, for one and for
// three descriptors.
func BenchmarkShouldRateLimit(b *testing.B) {
	for _, n := range []int{1, 3} {
		b.Run(strconv.Itoa(n)+"-descriptors", func(b *testing.B) {
			s := &Service{engine: &constEngine{}, metrics: testMetrics(b), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
			req := &rlsv3.RateLimitRequest{Domain: "d"}
			for i := range n {
				req.Descriptors = append(req.Descriptors, desc("user", "u"+strconv.Itoa(i)))
			}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.ShouldRateLimit(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// constEngine answers one fixed OK status per descriptor.
type constEngine struct{}

var constLimit = &descriptors.Limit{}

func (constEngine) SetTree(*descriptors.Tree) {}

func (constEngine) ShouldRateLimit(_ context.Context, req *engine.Request) (*engine.Response, error) {
	resp := &engine.Response{Code: engine.CodeOK, Statuses: make([]engine.Status, len(req.Descriptors))}
	for i := range resp.Statuses {
		resp.Statuses[i] = engine.Status{
			Code:  engine.CodeOK,
			Limit: &engine.CurrentLimit{RequestsPerUnit: 10, Unit: tiers.UnitSecond},
			Match: descriptors.Match{Limit: constLimit, MetricKey: "d.user"},
		}
	}
	return resp, nil
}

// TestResetHeaderNever: a reset that never comes (the largest Duration)
// renders as a large positive number of seconds, not an overflow.
func TestResetHeaderNever(t *testing.T) {
	h := rateLimitHeaders([]engine.Status{{Limit: &engine.CurrentLimit{RequestsPerUnit: 5}, ResetAfter: math.MaxInt64}}, defaultHeaderNames)
	if len(h) != 3 || h[2].Value != "9223372037" {
		t.Errorf("RateLimit-Reset for never: %v, want 9223372037", h)
	}
}

// TestWaitingServerAnswersUnavailable: while its server waits for a first
// configuration (server.Options.WaitForConfig), the service answers
// UNAVAILABLE saying what is awaited, over gRPC and /json (503), counted
// as an error; once one is applied, it decides.
func TestWaitingServerAnswersUnavailable(t *testing.T) {
	const waiting = "waiting for the first from the xDS server cp:1"
	s, stop := newTestServer(t, Options{}, server.Options{WaitForConfig: true, WaitingFor: waiting})
	defer stop()
	c := rlsv3.NewRateLimitServiceClient(dial(t, s.GRPCAddr()))
	req := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("k", "v")}}
	if _, err := c.ShouldRateLimit(context.Background(), req); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "no configuration yet: "+waiting) {
		t.Errorf("before the first config: %v, want UNAVAILABLE saying %q", err, waiting)
	}
	if body, code := post(t, "http://"+s.HTTPAddr()+"/json", `{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}`); code != http.StatusInternalServerError || !strings.Contains(body, waiting) {
		t.Errorf("/json before the first config: %d %q", code, body)
	}
	if got := metricValue(t, s.svc.metrics.requestErrors); got != 2 {
		t.Errorf("charon_request_errors_total %v, want 2", got)
	}
	s.ApplyConfig(&config.Config{}, "xds", "v1")
	if resp, err := c.ShouldRateLimit(context.Background(), req); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Errorf("after the first config: %v, %v; want OK", resp, err)
	}
}
