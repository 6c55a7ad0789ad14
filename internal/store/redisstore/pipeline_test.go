package redisstore

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/storetest"
	"github.com/charonlimit/charon/tiers"
)

// TestPipelinedConcurrent runs 64 concurrent callers, each deciding 15
// times on its own key (limit 10) and on one shared key (limit 100): every
// answer is exact, and the commands went as one FCALL per decision in
// fewer pipelines than decisions when callers met.
func TestPipelinedConcurrent(t *testing.T) {
	_, c := singleClient(t)
	var cnt counter
	c.AddHook(&cnt)
	s := testStore(t, c, Options{Clock: ClockCaller})
	defer s.Close()
	if err := s.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	cnt.take()
	own := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 10, Window: 1e9, Active: tiers.Unbounded}}}
	shared := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 100, Window: 1e9, Active: tiers.Unbounded}}}
	const callers, calls = 64, 15
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		granted int
		hits    = map[int64]int{}
		errs    []error
	)
	start := make(chan struct{})
	for g := range callers {
		wg.Go(func() {
			<-start
			out := make([]tiers.Decision, 1)
			for i := range calls {
				mine := []store.Item{item(own, "own", fmt.Sprint("g", g), 1)}
				if err := s.Decide(context.Background(), storetest.T0, mine, out); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
				want := i < 10
				if out[0].OK != want || (want && out[0].TierHits != int64(i+1)) {
					mu.Lock()
					errs = append(errs, fmt.Errorf("caller %d call %d: %+v, want OK=%v with %d hits", g, i, out[0], want, i+1))
					mu.Unlock()
				}
				if err := s.Decide(context.Background(), storetest.T0, []store.Item{item(shared, "shared", "all", 1)}, out); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
				mu.Lock()
				if out[0].OK {
					granted++
					hits[out[0].TierHits]++
				}
				mu.Unlock()
			}
		})
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
	if granted != 100 {
		t.Errorf("shared key: %d granted, want exactly 100", granted)
	}
	for h := int64(1); h <= 100; h++ {
		if hits[h] != 1 {
			t.Errorf("shared key: %d grants saw %d hits, want exactly one", hits[h], h)
		}
	}
	pipes := cnt.takePipes()
	got := cnt.take()
	if len(got) != 1 || got["fcall"] != 2*callers*calls {
		t.Errorf("commands %v, want %d fcalls only", got, 2*callers*calls)
	}
	t.Logf("%d decisions in %d pipelines", 2*callers*calls, pipes)
}

// gate is a go-redis hook that holds the next pipeline, once armed, until
// released.
type gate struct {
	mu      sync.Mutex
	armed   bool
	entered chan struct{}
	release chan struct{}
}

func (g *gate) arm() {
	g.mu.Lock()
	g.armed = true
	g.entered = make(chan struct{})
	g.release = make(chan struct{})
	g.mu.Unlock()
}

func (g *gate) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (g *gate) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (g *gate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		g.mu.Lock()
		armed := g.armed
		g.armed = false
		entered, release := g.entered, g.release
		g.mu.Unlock()
		if armed {
			close(entered)
			<-release
		}
		return next(ctx, cmds)
	}
}

// TestPipelineCancelledCaller holds a dispatcher's pipeline in flight: its
// caller, cancelled, returns at once; a caller queued behind it and
// cancelled returns at once and is not sent; another queued caller is
// answered once the pipeline returns; the held call ran, and what it
// granted, which its caller was never told, was given back.
func TestPipelineCancelledCaller(t *testing.T) {
	_, c := singleClient(t)
	var g gate
	c.AddHook(&g)
	s := testStore(t, c, Options{Clock: ClockCaller, Pipelines: 1})
	defer s.Close()
	storetest.Decide(t, s, storetest.T0, item(lyft, "a", "x", 1)) // loads the function
	g.arm()

	decide := func(ctx context.Context, hits int64) (tiers.Decision, error) {
		out := make([]tiers.Decision, 1)
		err := s.Decide(ctx, storetest.T0, []store.Item{item(lyft, "a", "x", hits)}, out)
		return out[0], err
	}
	type answer struct {
		d   tiers.Decision
		err error
	}
	run := func(ctx context.Context, hits int64) chan answer {
		ch := make(chan answer, 1)
		go func() {
			d, err := decide(ctx, hits)
			ch <- answer{d, err}
		}()
		return ch
	}
	ctxA, cancelA := context.WithCancel(context.Background())
	a := run(ctxA, 1)
	<-g.entered // A's pipeline is held
	cancelA()
	if r := <-a; !errors.Is(r.err, context.Canceled) || errors.Is(r.err, store.ErrNotSent) {
		t.Fatalf("held caller: %+v, want context.Canceled (sent: not ErrNotSent)", r)
	}
	ctxB, cancelB := context.WithCancel(context.Background())
	b := run(ctxB, 3)
	for len(s.q) < 1 {
		runtime.Gosched()
	}
	cc := run(context.Background(), 1)
	for len(s.q) < 2 {
		runtime.Gosched()
	}
	cancelB()
	if r := <-b; !errors.Is(r.err, context.Canceled) || !errors.Is(r.err, store.ErrNotSent) {
		t.Fatalf("queued caller: %+v, want context.Canceled and ErrNotSent", r)
	}
	close(g.release)
	r := <-cc
	if r.err != nil {
		t.Fatal(r.err)
	}
	// 1 (load) + 1 (C); A's 1 was applied then given back; B's 3 were
	// not sent.
	if !r.d.OK || r.d.TierHits != 2 {
		t.Fatalf("queued caller: %+v, want granted with 2 hits", r.d)
	}
	if given, failed := s.LateGrants(); given != 1 || failed != 0 {
		t.Errorf("late grants given back %d, failed %d; want 1 and 0", given, failed)
	}
}
