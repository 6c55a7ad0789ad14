package charon

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/charonlimit/charon/internal/engine"
)

// TestUsageConcurrency: GET /usage of a concurrency limit shows the slots
// held, of its limit, renewing when the oldest frees itself (its ttl).
func TestUsageConcurrency(t *testing.T) {
	const text = `domain: api
descriptors:
  - key: tenant
    concurrency: {limit: 1, ttl: 30s}
`
	now := time.Date(2030, 6, 1, 21, 0, 0, 0, time.UTC)
	eng := engineFor(t, text, now)
	req := &engine.Request{Domain: "api", Descriptors: []engine.Descriptor{{Entries: entriesOf("tenant", "acme")}}}
	if resp, err := eng.ShouldRateLimit(context.Background(), req); err != nil || resp.Code != engine.CodeOK {
		t.Fatalf("the take: %v, %v", resp, err)
	}
	u, err := usage(context.Background(), eng, req)
	if err != nil {
		t.Fatal(err)
	}
	renews := now.Add(30 * time.Second)
	want := []UsageLimit{{Resource: "api/tenant", Domain: "acme", Kind: "concurrency", Period: "in flight, ttl 30s", Limit: 1, Used: 1, Remaining: 0, Renews: &renews}}
	if diff := cmp.Diff(want, u.Limits); diff != "" {
		t.Errorf("usage (-want +got):\n%s", diff)
	}
}
