package engine

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/store/memstore"
)

// benchRequests is one single-descriptor request per key, over 10,000 keys
// of a key-only limit.
func benchRequests() []*Request {
	reqs := make([]*Request, 10000)
	for i := range reqs {
		reqs[i] = &Request{Domain: "test", Descriptors: []Descriptor{desc("user", "u"+strconv.Itoa(i))}}
	}
	return reqs
}

func benchEngine(b *testing.B) *Engine {
	st := memstore.New(memstore.Options{})
	b.Cleanup(func() { st.Close() })
	nodes := []*descriptors.Node{{Key: "user", Limit: &descriptors.Limit{Name: "per_user", Policy: lyft(1000, time.Second)}}}
	tree, err := descriptors.NewTree([]descriptors.DomainSpec{{Config: descriptors.DomainConfig{Name: "test"}, Nodes: nodes}})
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	e := New(Options{Store: st, Now: func() time.Time { return start.Add(time.Since(start)) }})
	e.SetTree(tree)
	return e
}

// BenchmarkShouldRateLimit is the engine over the in-memory store: one
// descriptor per request, 10,000 keys, all goroutines.
func BenchmarkShouldRateLimit(b *testing.B) {
	benchParallel(b, func(e *Engine, ctx context.Context, req *Request, _ *Response) error {
		_, err := e.ShouldRateLimit(ctx, req)
		return err
	})
}

// BenchmarkDecide is the same with a reused Response.
func BenchmarkDecide(b *testing.B) {
	benchParallel(b, (*Engine).Decide)
}

// benchParallel runs decide over benchEngine and benchRequests on all
// goroutines, each with a Response of its own.
func benchParallel(b *testing.B, decide func(e *Engine, ctx context.Context, req *Request, resp *Response) error) {
	e := benchEngine(b)
	reqs := benchRequests()
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var resp Response
		i := int(start.Add(7919))
		for pb.Next() {
			i++
			if err := decide(e, ctx, reqs[i%len(reqs)], &resp); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// start spreads the parallel benchmark goroutines over the keys.
var start atomic.Int64

// BenchmarkThree is make bench's three-descriptor workload ({user},
// {tenant}, {api, user} of examples/config's bench domain, over 10,000
// users, 100 tenants and 10 apis, drawn as charon bench draws them) on one
// goroutine, after a warm-up that creates most of its 110,000 states: what
// the decisions cost without gRPC, mostly cache misses on those states.
func BenchmarkThree(b *testing.B) {
	cfg, _, err := config.Load(config.DirFS("../../examples/config"), config.Options{})
	if err != nil {
		b.Fatal(err)
	}
	st := memstore.New(memstore.Options{})
	b.Cleanup(func() { st.Close() })
	// 30 µs a request: the users stay far below their limits.
	t0, tick := time.Unix(1_700_000_000, 0), time.Duration(0)
	e := New(Options{Store: st, Now: func() time.Time { tick += 30 * time.Microsecond; return t0.Add(tick) }})
	e.SetTree(cfg.Tree)
	values := make([]string, 10000)
	for i := range values {
		values[i] = "k" + strconv.Itoa(i)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	reqs := make([]*Request, 1<<16)
	for i := range reqs {
		u, api := rng.IntN(len(values)), rng.IntN(10)
		reqs[i] = &Request{Domain: "bench", Descriptors: []Descriptor{
			desc("user", values[u]), desc("tenant", values[u/100]), desc("api", values[api], "user", values[u]),
		}}
	}
	ctx := context.Background()
	var resp Response
	for i := range 300_000 {
		if err := e.Decide(ctx, reqs[i%len(reqs)], &resp); err != nil {
			b.Fatal(err)
		}
	}
	if resp.Code != CodeOK {
		b.Fatalf("a warm-up request was answered %v", resp.Code)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if err := e.Decide(ctx, reqs[i%len(reqs)], &resp); err != nil {
			b.Fatal(err)
		}
	}
}
