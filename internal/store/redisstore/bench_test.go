package redisstore

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/charonlimit/charon/internal/redistest"
	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/tiers"
)

// benchDecide decides one item per call over 10,000 keys from parallel
// goroutines.
func benchDecide(b *testing.B, s store.Store) {
	p := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 100, Window: time.Second, Active: tiers.Unbounded}}}
	items := make([]store.Item, 10000)
	for i := range items {
		items[i] = store.Item{Key: store.Key{Resource: "bench/key=value", Domain: fmt.Sprint("user", i), PolicyID: 1}, Policy: p, Hits: 1, Min: 1}
	}
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		out := make([]tiers.Decision, 1)
		ctx := context.Background()
		for pb.Next() {
			i := next.Add(1) % int64(len(items))
			if err := s.Decide(ctx, time.Now(), items[i:i+1], out); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkDecide: 1 item, 10,000 keys, parallel, against a local
// redis-server (Redis clock), and the memory store for comparison.
func BenchmarkDecide(b *testing.B) {
	for _, v := range []struct {
		name      string
		pipelines int
	}{{"redis", 0}, {"redis-unpipelined", -1}} {
		b.Run(v.name, func(b *testing.B) { benchRedis(b, v.pipelines) })
	}
	b.Run("memstore", func(b *testing.B) {
		benchDecide(b, memstore.New(memstore.Options{}))
	})
}

// benchRedis runs benchDecide on a Redis store with the given
// Options.Pipelines.
func benchRedis(b *testing.B, pipelines int) {
	n := redistest.Single(b)
	s := testStore(b, redistest.Client(b, n), Options{Pipelines: pipelines})
	if err := s.Load(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.SetParallelism(16)
	benchDecide(b, s)
	b.StopTimer()
	if us, ok := fcallMicros(n.Port, b.N); ok {
		b.ReportMetric(us, "redis-µs/call")
	}
}
