package escrow

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/charonlimit/charon/internal/redistest"
	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/internal/store/redisstore"
	"github.com/charonlimit/charon/internal/store/resilient"
	"github.com/charonlimit/charon/tiers"
)

// BenchmarkHotKey decides one hot key under its limit (a rate_limit of
// 100 million a minute), from parallel callers, on the real clock:
//
//   - memory: the memory store alone (one process);
//   - redis: today's shared path, the resilient store over Redis (one
//     node on loopback);
//   - escrow-memory, escrow-redis: the escrow store in front of them,
//     its loop running, leases taken from the memory store or Redis
//     (leases of 1s); escrow-redis-1s: a limit per second (leases of
//     50ms); escrow-region: a replica of a region, its leases taken from
//     a region's pool (in memory) whose slices come from Redis, the home.
//
// It reports the shared store's calls per decision (leases, checks and
// give-backs included) for the Redis cases, and the 99th percentile of a
// decision's time (p99-ns: one decision in 16 timed). Compare ratios of one run,
// never absolutes (docs/performance.md, "Escrow leases").
func BenchmarkHotKey(bench *testing.B) {
	p := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 100_000_000, Window: time.Minute, Active: tiers.Unbounded}}}
	var node *redistest.Node
	redisStore := func(b *testing.B) *redisstore.Store {
		if node == nil {
			node = redistest.Single(bench) // the parent's: sub-benchmarks run several times
		}
		rs, err := redisstore.NewWithClient(redistest.Client(b, node), redisstore.Options{})
		if err != nil {
			b.Fatal(err)
		}
		return rs // closed by the resilient store that owns it
	}
	perSecond := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 100_000_000, Window: time.Second, Active: tiers.Unbounded}}}
	for _, name := range []string{"memory", "escrow-memory", "redis", "escrow-redis", "escrow-redis-1s", "escrow-region"} {
		bench.Run(name, func(b *testing.B) {
			p := p
			if name == "escrow-redis-1s" {
				p = perSecond // leases of 50ms
			}
			var s store.Store
			var calls *counting
			switch name {
			case "memory", "escrow-memory":
				mem := memstore.New(memstore.Options{MaxKeys: -1})
				b.Cleanup(func() { mem.Close() })
				s = mem
				if name == "escrow-memory" {
					s = benchEscrow(b, mem, mem)
				}
			case "redis", "escrow-redis", "escrow-redis-1s", "escrow-region":
				calls = &counting{remote: redisStore(b)}
				res := resilient.New(calls, resilient.Options{Timeout: time.Second})
				b.Cleanup(func() { res.Close() })
				s = res
				switch name {
				case "escrow-region":
					r, err := NewRegion(RegionOptions{Home: calls, Pool: NewMemPool(nil), Run: true})
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(func() { r.Close() })
					s = benchEscrow(b, res, r)
				case "escrow-redis", "escrow-redis-1s":
					s = benchEscrow(b, res, calls)
				}
			}
			it := []store.Item{{Key: store.Key{Resource: "bench/" + name, Domain: "hot", PolicyID: 1}, Policy: p, Hits: 1, Min: 1}}
			// Warm up: the key enters escrow and its leases follow its rate.
			warm := time.Now().Add(500 * time.Millisecond)
			out := make([]tiers.Decision, 1)
			for time.Now().Before(warm) {
				if err := s.Decide(context.Background(), time.Now(), it, out); err != nil || !out[0].OK {
					b.Fatal(err, out[0])
				}
			}
			var n atomic.Int64
			if calls != nil {
				calls.n.Store(0)
			}
			var mu sync.Mutex
			var took []time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				out := make([]tiers.Decision, 1)
				mine := make([]time.Duration, 0, 1<<16)
				for i := 0; pb.Next(); i++ {
					t0 := time.Now()
					if err := s.Decide(context.Background(), t0, it, out); err != nil || !out[0].OK {
						b.Error(err, out[0])
						return
					}
					if i%16 == 0 && len(mine) < cap(mine) {
						mine = append(mine, time.Since(t0))
					}
					n.Add(1)
				}
				mu.Lock()
				took = append(took, mine...)
				mu.Unlock()
			})
			b.StopTimer()
			if calls != nil {
				b.ReportMetric(float64(calls.n.Load())/float64(n.Load()), "calls/decision")
			}
			if len(took) > 0 {
				slices.Sort(took)
				b.ReportMetric(float64(took[len(took)*99/100]), "p99-ns")
			}
		})
	}
}

// benchEscrow is an escrow store of the defaults on remote, leasing from
// leaser, its loop running.
func benchEscrow(b *testing.B, remote store.Store, leaser Leaser) *Store {
	s, err := New(Options{Remote: remote, Leaser: leaser, Default: true, Size: SizeDemand, Run: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

// counting counts the calls that reach the shared store.
type counting struct {
	remote
	n atomic.Int64
}

// remote is the Redis store as the resilient store and escrow see it.
type remote interface {
	Leaser
	Ping(ctx context.Context) error
}

func (c *counting) Decide(ctx context.Context, now time.Time, items []store.Item, out []tiers.Decision) error {
	c.n.Add(1)
	return c.remote.Decide(ctx, now, items, out)
}

func (c *counting) Reserve(ctx context.Context, now time.Time, after time.Duration, items []store.Item, out []tiers.Decision) (time.Time, error) {
	c.n.Add(1)
	return c.remote.Reserve(ctx, now, after, items, out)
}

func (c *counting) GiveBack(ctx context.Context, now, at time.Time, items []store.Item) error {
	c.n.Add(1)
	return c.remote.GiveBack(ctx, now, at, items)
}

// BenchmarkColdKeys decides keys that do not get hot on the memory store,
// alone and behind the escrow store: with escrow off for their rule (a
// lookup of the rule), and on but the keys under the threshold (the lookup
// of the pair and the sketch's count too). The cost the escrow store adds
// to the path of cold keys, measured where it is not hidden by a round
// trip.
func BenchmarkColdKeys(b *testing.B) {
	p := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 1 << 40, Window: time.Minute, Active: tiers.Unbounded}}}
	keys := make([]store.Key, 4096)
	for i := range keys {
		keys[i] = store.Key{Resource: "bench/cold", Domain: strconv.Itoa(i), PolicyID: 1}
	}
	for _, name := range []string{"memory", "escrow-off", "escrow-on"} {
		b.Run(name, func(b *testing.B) {
			mem := memstore.New(memstore.Options{MaxKeys: -1})
			b.Cleanup(func() { mem.Close() })
			var s store.Store = mem
			if name != "memory" {
				e, err := New(Options{Remote: mem, Default: name == "escrow-on", Threshold: 1e15, Run: true})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { e.Close() })
				s = e
			}
			out := make([]tiers.Decision, 1)
			it := []store.Item{{Policy: p, Hits: 1, Min: 1}}
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				it[0].Key = keys[i%len(keys)]
				i++
				if err := s.Decide(context.Background(), time.Now(), it, out); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
