package rls

import (
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/charonlimit/charon/internal/engine"
)

// TestConcurrencyAnswer: an RLS answer that took slots of a concurrency
// limit says how many and their instant in its dynamic metadata (under
// "charon": what Envoy's stream-done refund reads back); an answer that
// took none (over the limit) says nothing, so that Envoy sends no refund
// for it. The refund built from it, as Envoy builds it (hits_addend,
// is_negative_hits, the instant as a last entry), gives that request's slot
// back.
func TestConcurrencyAnswer(t *testing.T) {
	const text = `domain: api
descriptors:
  - key: tenant
    concurrency: {limit: 1, ttl: 30s}
`
	now := time.Date(2030, 6, 1, 21, 0, 0, 0, time.UTC)
	eng := engineFor(t, text, now)
	s := &Service{engine: eng, metrics: testMetrics(t), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	first := ask(t, s, desc("tenant", "acme"))
	if first.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("first: %v", first.OverallCode)
	}
	slot := strconv.FormatInt(now.UnixMicro(), 10)
	want := map[string]any{"slots": 1.0, "slot": slot}
	if diff := cmp.Diff(want, first.GetDynamicMetadata().GetFields()[AttributionKey].GetStructValue().AsMap()); diff != "" {
		t.Errorf("dynamic metadata (-want +got):\n%s", diff)
	}
	if l := first.Statuses[0].GetCurrentLimit(); l.GetName() != "1 in flight, ttl 30s" || l.GetRequestsPerUnit() != 1 {
		t.Errorf("current_limit %v, want 1 named \"1 in flight, ttl 30s\"", l)
	}
	over := ask(t, s, desc("tenant", "acme"))
	if over.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("second: %v, want OVER_LIMIT", over.OverallCode)
	}
	if c := over.GetDynamicMetadata().GetFields()[AttributionKey].GetStructValue(); c.GetFields()["slots"] != nil || c.GetFields()["slot"] != nil {
		t.Errorf("an answer over the limit names slots: %v", c)
	}

	// The stream-done refund, as Envoy sends it.
	refund := desc("tenant", "acme", engine.SlotKey, slot)
	refund.HitsAddend = wrapperspb.UInt64(1)
	refund.IsNegativeHits = true
	if r := ask(t, s, refund); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("refund: %v", r.OverallCode)
	}
	if r := ask(t, s, desc("tenant", "acme")); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Error("the slot did not come back with the refund")
	}
}
