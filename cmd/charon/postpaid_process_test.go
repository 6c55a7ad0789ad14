package main

import (
	"context"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// budgetConfig is an unchanged envoyproxy/ratelimit configuration of a
// token budget: 5 per minute per user, 100 per minute per model.
const budgetConfig = `domain: ai
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: model
    rate_limit: {unit: minute, requests_per_unit: 100}
`

// TestPostPaidBudgetEveryStore: with STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT
// =false, the budget pattern of Envoy Gateway's cost.response and AI
// Gateway's token limits (a check of 0 hits at the request, the usage
// reported at the response) exhausts the budget and refuses the next check,
// on the memory store, a single Redis and a Redis Cluster; a report over
// two descriptors in different Cluster slots debits both.
func TestPostPaidBudgetEveryStore(t *testing.T) {
	bin := buildCharon(t)
	dir := writeConfigDir(t, "ai.yaml", budgetConfig)
	for _, st := range everyStore() {
		t.Run(st.name, func(t *testing.T) {
			p := startServeEnv(t, bin, []string{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=false"}, st.serveArgs(t, dir)...)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			ask := func(hits uint64, entries ...string) *rlsv3.RateLimitResponse {
				t.Helper()
				req := &rlsv3.RateLimitRequest{Domain: "ai"}
				for i := 0; i+1 < len(entries); i += 2 {
					req.Descriptors = append(req.Descriptors, &ratelimitv3.RateLimitDescriptor{
						Entries:    []*ratelimitv3.RateLimitDescriptor_Entry{{Key: entries[i], Value: entries[i+1]}},
						HitsAddend: wrapperspb.UInt64(hits),
					})
				}
				resp, err := p.rls.ShouldRateLimit(ctx, req)
				if err != nil {
					t.Fatalf("ShouldRateLimit: %v\n%s", err, p.stderr.String())
				}
				return resp
			}
			ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
			for i, step := range []struct {
				hits      uint64
				code      rlsv3.RateLimitResponse_Code
				remaining uint32
			}{
				{0, ok, 5},   // the check at the request
				{4, ok, 1},   // the usage reported
				{4, over, 0}, // overdraws: debited all the same
				{0, over, 0}, // the next check is refused
				{1, over, 0},
			} {
				resp := ask(step.hits, "user", "alice")
				if resp.OverallCode != step.code || resp.Statuses[0].LimitRemaining != step.remaining {
					t.Errorf("step %d (%d hits): %v remaining %d, want %v remaining %d", i, step.hits, resp.OverallCode, resp.Statuses[0].LimitRemaining, step.code, step.remaining)
				}
			}
			// A report over two descriptors, one of which overdraws: both
			// are debited (on a Cluster, two slots and the two-step).
			if resp := ask(4, "user", "bob", "model", "m1"); resp.OverallCode != ok {
				t.Fatalf("bob's first report: %v", resp.OverallCode)
			}
			if resp := ask(4, "user", "bob", "model", "m1"); resp.OverallCode != over {
				t.Fatalf("bob's second report: %v, want OVER_LIMIT", resp.OverallCode)
			}
			resp := ask(0, "model", "m1")
			if resp.OverallCode != ok || resp.Statuses[0].LimitRemaining != 92 {
				t.Errorf("model after two reports of 4: %v remaining %d, want OK remaining 92", resp.OverallCode, resp.Statuses[0].LimitRemaining)
			}
			p.stop(t)
		})
	}
}
