package rls

import (
	"context"
	"strconv"
	"testing"
	"testing/fstest"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/tiers"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// TestRateLimitHeadersSource: the RateLimit headers describe the status
// envoyproxy/ratelimit takes them from: the last OVER_LIMIT status that is
// not a quota descriptor's, else the first limited one with the smallest
// remaining (a quota descriptor over its limit, or a shadow one, only by its
// remaining).
func TestRateLimitHeadersSource(t *testing.T) {
	status := func(code engine.Code, limit, remaining uint32, reset time.Duration) engine.Status {
		return engine.Status{Code: code, Limit: &engine.CurrentLimit{RequestsPerUnit: limit, Unit: tiers.UnitMinute}, Remaining: remaining, ResetAfter: reset}
	}
	ok, over := engine.CodeOK, engine.CodeOverLimit
	quotaOver := status(over, 5, 0, 5*time.Second)
	quotaOver.Quota = true
	for _, tc := range []struct {
		name string
		sts  []engine.Status
		want [3]string
	}{
		{"smallest remaining", []engine.Status{status(ok, 7, 3, time.Second), status(ok, 2, 1, 2*time.Second), status(ok, 9, 1, 3*time.Second)}, [3]string{"2", "1", "2"}},
		{"the rejecting limit, not an equal remaining before it", []engine.Status{status(ok, 2, 0, 20*time.Second), status(over, 10, 0, 75320*time.Second)}, [3]string{"10", "0", "75320"}},
		{"the last rejecting limit", []engine.Status{status(over, 3, 0, time.Second), status(ok, 1, 0, 2*time.Second), status(over, 4, 0, 3*time.Second)}, [3]string{"4", "0", "3"}},
		{"a rejecting sliding window keeps its remaining", []engine.Status{status(ok, 9, 0, time.Second), status(over, 60, 30, time.Minute)}, [3]string{"60", "30", "60"}},
		{"a quota descriptor over only by its remaining", []engine.Status{status(ok, 2, 0, 20*time.Second), quotaOver}, [3]string{"2", "0", "20"}},
		{"a quota descriptor over with the smallest remaining", []engine.Status{status(ok, 2, 1, 20*time.Second), quotaOver}, [3]string{"5", "0", "5"}},
		{"not limited", []engine.Status{{Code: ok, Remaining: 0}, status(ok, 8, 6, time.Second)}, [3]string{"8", "6", "1"}},
	} {
		h := rateLimitHeaders(tc.sts, defaultHeaderNames)
		if d := cmp.Diff(rateLimitHeadersWant(tc.want[0], tc.want[1], tc.want[2]), h, protocmp.Transform()); d != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, d)
		}
	}
}

// fixedDomain is envoyproxy/ratelimit's configuration of the
// --fixed-window tests.
const fixedDomain = `domain: test
descriptors:
  - key: n
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: d
    rate_limit: {unit: day, requests_per_unit: 10}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: z
    rate_limit: {unit: minute, requests_per_unit: 0}
`

// TestRLSFixedWindowLikeLyft: under --fixed-window (its config option and
// its engine option), at 40.3 s into a minute, the RLS answers are
// envoyproxy/ratelimit's field for field: duration_until_reset is its
// CalculateReset in whole seconds (20 s, not 19.7 s, which Envoy would show
// as 19), an OVER_LIMIT status has limit_remaining 0 even when fewer hits
// than asked remain, a limit of 0 reports the unit asked and the window's
// reset, and the RateLimit headers describe the limit that rejected the
// request.
func TestRLSFixedWindowLikeLyft(t *testing.T) {
	cfg, _, err := config.Load(fstest.MapFS{"test.yaml": {Data: []byte(fixedDomain)}}, config.Options{FixedWindowDefault: true})
	if err != nil {
		t.Fatal(err)
	}
	st := memstore.New(memstore.Options{})
	defer st.Close()
	now := time.Date(2030, 1, 2, 3, 4, 40, 300e6, time.UTC)
	eng := engine.New(engine.Options{Store: st, Now: func() time.Time { return now }, FixedWindowOverrides: true})
	eng.SetTree(cfg.Tree)
	rls := func(ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
		t.Helper()
		req, err := toEngineRequest(&rlsv3.RateLimitRequest{Domain: "test", Descriptors: ds})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := eng.ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		return toProtoResponse(resp, true, defaultHeaderNames)
	}
	withHits := func(n uint64, d *ratelimitv3.RateLimitDescriptor) *ratelimitv3.RateLimitDescriptor {
		d.HitsAddend = wrapperspb.UInt64(n)
		return d
	}
	const (
		ok, over = rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
		minute   = rlsv3.RateLimitResponse_RateLimit_MINUTE
		day      = rlsv3.RateLimitResponse_RateLimit_DAY
	)
	status := func(code rlsv3.RateLimitResponse_Code, limit uint32, unit rlsv3.RateLimitResponse_RateLimit_Unit, remaining uint32, reset int64) *rlsv3.RateLimitResponse_DescriptorStatus {
		return &rlsv3.RateLimitResponse_DescriptorStatus{Code: code, LimitRemaining: remaining, DurationUntilReset: durationpb.New(time.Duration(reset) * time.Second),
			CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: limit, Unit: unit}}
	}
	// The rests of the minute (60 − 40) and of the day (86400 − 3:04:40).
	const restMinute, restDay = 20, 75320
	zero := desc("own", "x")
	zero.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 0, Unit: typev3.RateLimitUnit_MINUTE}
	for _, step := range []struct {
		what string
		ds   []*ratelimitv3.RateLimitDescriptor
		want *rlsv3.RateLimitResponse
	}{
		{"n's first hit", []*ratelimitv3.RateLimitDescriptor{desc("n", "x")}, &rlsv3.RateLimitResponse{OverallCode: ok,
			Statuses:             []*rlsv3.RateLimitResponse_DescriptorStatus{status(ok, 2, minute, 1, restMinute)},
			ResponseHeadersToAdd: rateLimitHeadersWant("2", "1", "20")}},
		{"d filled", []*ratelimitv3.RateLimitDescriptor{withHits(10, desc("d", "x"))}, &rlsv3.RateLimitResponse{OverallCode: ok,
			Statuses:             []*rlsv3.RateLimitResponse_DescriptorStatus{status(ok, 10, day, 0, restDay)},
			ResponseHeadersToAdd: rateLimitHeadersWant("10", "0", "75320")}},
		// n would be left with 0, as d is: the headers are d's, which
		// rejected the request.
		{"n within, d over", []*ratelimitv3.RateLimitDescriptor{desc("n", "x"), desc("d", "x")}, &rlsv3.RateLimitResponse{OverallCode: over,
			Statuses:             []*rlsv3.RateLimitResponse_DescriptorStatus{status(ok, 2, minute, 0, restMinute), status(over, 10, day, 0, restDay)},
			ResponseHeadersToAdd: rateLimitHeadersWant("10", "0", "75320")}},
		{"b: 50 hits", []*ratelimitv3.RateLimitDescriptor{withHits(50, desc("b", "x"))}, &rlsv3.RateLimitResponse{OverallCode: ok,
			Statuses:             []*rlsv3.RateLimitResponse_DescriptorStatus{status(ok, 100, minute, 50, restMinute)},
			ResponseHeadersToAdd: rateLimitHeadersWant("100", "50", "20")}},
		{"b: 60 more", []*ratelimitv3.RateLimitDescriptor{withHits(60, desc("b", "x"))}, &rlsv3.RateLimitResponse{OverallCode: over,
			Statuses:             []*rlsv3.RateLimitResponse_DescriptorStatus{status(over, 100, minute, 0, restMinute)},
			ResponseHeadersToAdd: rateLimitHeadersWant("100", "0", "20")}},
		{"b: 101 hits", []*ratelimitv3.RateLimitDescriptor{withHits(101, desc("b", "y"))}, &rlsv3.RateLimitResponse{OverallCode: over,
			Statuses:             []*rlsv3.RateLimitResponse_DescriptorStatus{status(over, 100, minute, 0, restMinute)},
			ResponseHeadersToAdd: rateLimitHeadersWant("100", "0", "20")}},
		{"a configured limit of 0", []*ratelimitv3.RateLimitDescriptor{desc("z", "x")}, &rlsv3.RateLimitResponse{OverallCode: over,
			Statuses:             []*rlsv3.RateLimitResponse_DescriptorStatus{status(over, 0, minute, 0, restMinute)},
			ResponseHeadersToAdd: rateLimitHeadersWant("0", "0", "20")}},
		{"a request's own limit of 0", []*ratelimitv3.RateLimitDescriptor{zero}, &rlsv3.RateLimitResponse{OverallCode: over,
			Statuses:             []*rlsv3.RateLimitResponse_DescriptorStatus{status(over, 0, minute, 0, restMinute)},
			ResponseHeadersToAdd: rateLimitHeadersWant("0", "0", "20")}},
	} {
		got := rls(step.ds...)
		if d := cmp.Diff(step.want, got, protocmp.Transform()); d != "" {
			t.Errorf("%s (-want +got):\n%s", step.what, d)
		}
	}
}

// TestRLSZeroLimitLikeLyft: envoyproxy/ratelimit's example ban
// (requests_per_unit: 0, name banned_limit) and a request's own limit of 0
// answer as there in both modes, the default sliding one and
// --fixed-window: OVER_LIMIT, the configured name and unit, nothing
// remaining, and the rest of the unit's window as the reset (its
// CalculateReset), never an unbounded duration.
func TestRLSZeroLimitLikeLyft(t *testing.T) {
	const banned = `domain: rl
descriptors:
  - key: bar
    value: banned
    rate_limit:
      name: banned_limit
      unit: minute
      requests_per_unit: 0
  - key: sliding
    rate_limit: {unit: hour, requests_per_unit: 0, algorithm: sliding_window}
`
	now := time.Date(2030, 1, 2, 3, 4, 53, 200e6, time.UTC) // 7 s (6.8, rounded up) before the minute ends
	for _, fixed := range []bool{false, true} {
		cfg, _, err := config.Load(fstest.MapFS{"rl.yaml": {Data: []byte(banned)}}, config.Options{FixedWindowDefault: fixed})
		if err != nil {
			t.Fatal(err)
		}
		st := memstore.New(memstore.Options{})
		defer st.Close()
		eng := engine.New(engine.Options{Store: st, Now: func() time.Time { return now }, FixedWindowOverrides: fixed})
		eng.SetTree(cfg.Tree)
		own := desc("own", "x")
		own.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 0, Unit: typev3.RateLimitUnit_MINUTE}
		for _, tc := range []struct {
			what  string
			d     *ratelimitv3.RateLimitDescriptor
			name  string
			unit  rlsv3.RateLimitResponse_RateLimit_Unit
			reset int64
		}{
			{"bar=banned", desc("bar", "banned"), "banned_limit", rlsv3.RateLimitResponse_RateLimit_MINUTE, 7},
			{"a sliding_window of 0", desc("sliding", "x"), "", rlsv3.RateLimitResponse_RateLimit_HOUR, 55*60 + 7},
			{"a request's own limit of 0", own, "", rlsv3.RateLimitResponse_RateLimit_MINUTE, 7},
		} {
			req, err := toEngineRequest(&rlsv3.RateLimitRequest{Domain: "rl", Descriptors: []*ratelimitv3.RateLimitDescriptor{tc.d}})
			if err != nil {
				t.Fatal(err)
			}
			resp, err := eng.ShouldRateLimit(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			got := toProtoResponse(resp, true, defaultHeaderNames)
			reset := strconv.FormatInt(tc.reset, 10)
			want := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
				Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OVER_LIMIT,
					DurationUntilReset: durationpb.New(time.Duration(tc.reset) * time.Second),
					CurrentLimit:       &rlsv3.RateLimitResponse_RateLimit{Name: tc.name, Unit: tc.unit}}},
				ResponseHeadersToAdd: rateLimitHeadersWant("0", "0", reset)}
			if d := cmp.Diff(want, got, protocmp.Transform()); d != "" {
				t.Errorf("fixed %v, %s (-want +got):\n%s", fixed, tc.what, d)
			}
		}
	}
}
