package rlqs

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/charonlimit/charon/internal/sharestore"
)

// BenchmarkSecond is one second of 10,000 streams reporting 10 buckets each
// (per-user buckets of the per-minute rule: 10 users, so 10 budgets of
// 10,000 instances), then one tick: an op is the pipeline's work per report
// interval, without gRPC.
func BenchmarkSecond(b *testing.B) {
	const streams, buckets = 10000, 10
	f := newFixture(&testing.T{}, Options{Store: &sharestore.Memory{}})
	ss := make([]*Stream, streams)
	ids := make([]map[string]string, buckets)
	for k := range ids {
		ids[k] = map[string]string{"user": fmt.Sprintf("u%d", k)}
	}
	ctx := context.Background()
	usages := make([]Usage, buckets)
	report := func(elapsed time.Duration) {
		for i, s := range ss {
			for k := range usages {
				usages[k] = Usage{Bucket: ids[k], Elapsed: elapsed, Allowed: uint64(i%7 + k)}
			}
			if err := s.Report(ctx, "web", usages); err != nil {
				b.Fatal(err)
			}
			s.Pending()
		}
	}
	for i := range ss {
		ss[i] = f.a.Open()
	}
	report(0)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		f.clk.Advance(time.Second)
		report(time.Second)
		f.a.Tick(ctx)
		for _, s := range ss {
			s.Pending()
		}
	}
}
