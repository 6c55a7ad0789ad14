package rlqs

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/charonlimit/charon/internal/sharestore"
)

// BenchmarkSecond is one second of 10,000 streams reporting 10 buckets each
// (per-user buckets of the per-minute rule: 10 users, so 10 budgets of
// 10,000 instances), then one tick: an op is the pipeline's work per report
// interval, without gRPC. Demands hold steady, as in a steady state: the
// ticks renew leases, and each assignment is re-sent every other tick.
func BenchmarkSecond(b *testing.B) { benchSecond(b, false) }

// BenchmarkSecondResplit is BenchmarkSecond with every demand moving beyond
// the tolerance every second: every budget is split again at every tick.
func BenchmarkSecondResplit(b *testing.B) { benchSecond(b, true) }

func benchSecond(b *testing.B, moving bool) {
	const streams, buckets = 10000, 10
	f := newFixture(&testing.T{}, Options{Store: &sharestore.Memory{}})
	ss := make([]*Stream, streams)
	ids := make([]map[string]string, buckets)
	for k := range ids {
		ids[k] = map[string]string{"user": fmt.Sprintf("u%d", k)}
	}
	ctx := context.Background()
	usages := make([]Usage, buckets)
	round := 0
	sent := 0 // actions sent since the last tick
	report := func(elapsed time.Duration) {
		for i, s := range ss {
			for k := range usages {
				n := uint64(i%7 + k)
				if moving {
					n += uint64(round%2) * 10
				}
				usages[k] = Usage{Bucket: ids[k], Elapsed: elapsed, Allowed: n}
			}
			if err := s.Report(ctx, "web", usages); err != nil {
				b.Fatal(err)
			}
			sent += len(s.Pending())
		}
		round++
	}
	second := func() int {
		f.clk.Advance(time.Second)
		report(time.Second)
		f.a.Tick(ctx)
		for _, s := range ss {
			sent += len(s.Pending())
		}
		n := sent
		sent = 0
		return n
	}
	for i := range ss {
		ss[i] = f.a.Open()
	}
	report(0)
	second() // the first rates: every budget split
	second()
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime(b)
	total, most := 0, 0
	for range b.N {
		n := second()
		total += n
		most = max(most, n)
	}
	// CPU time, not only the wall clock: on a shared machine the wall
	// clock also counts the time other processes held the cores.
	b.ReportMetric((cpuTime(b)-cpu0).Seconds()/float64(b.N), "cpu-s/op")
	// The bucket actions sent per interval, on average and at the worst
	// interval: renewals falling due together make the worst the double of
	// the average (docs/performance.md, RLQS).
	b.ReportMetric(float64(total)/float64(b.N), "actions/op")
	b.ReportMetric(float64(most), "max-actions/op")
}

// cpuTime is the process' user and system CPU time.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
