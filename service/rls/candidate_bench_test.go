package rls

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"testing/fstest"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/internal/canary"
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/internal/store/memstore"
)

// BenchmarkCandidate measures ShouldRateLimit in process (no network):
// one descriptor of 1,000 users on the memory store, without a candidate
// configuration and with one (a limit per user, lower), whose difference
// is what the candidate costs per request.
func BenchmarkCandidate(b *testing.B) {
	load := func(text string) *config.Config {
		cfg, _, err := config.Load(fstest.MapFS{"c.yaml": {Data: []byte(text)}}, config.Options{})
		if err != nil {
			b.Fatal(err)
		}
		return cfg
	}
	live := load("domain: c\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 1000000}\n")
	cand := load("domain: c\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 100}\n")
	reqs := make([]*rlsv3.RateLimitRequest, 1000)
	for i := range reqs {
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "c", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", fmt.Sprint("u", i))}}
	}
	for _, withCandidate := range []bool{false, true} {
		name := "without"
		if withCandidate {
			name = "with"
		}
		b.Run(name, func(b *testing.B) {
			st := memstore.New(memstore.Options{})
			defer st.Close()
			eng := engine.New(engine.Options{Store: st})
			eng.SetTree(live.Tree)
			r := &Service{engine: eng, metrics: testMetrics(b), log: slog.New(slog.DiscardHandler)}
			if withCandidate {
				c := canary.New(canary.Options{})
				defer c.Close()
				c.SetConfig(cand)
				// Inline, to measure the candidate's own cost; the server
				// runs it in the background (observe.go).
				r.observers = []Observer{c}
			}
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if _, err := r.ShouldRateLimit(ctx, reqs[i%len(reqs)]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
