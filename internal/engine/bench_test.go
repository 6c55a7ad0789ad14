package engine

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

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
