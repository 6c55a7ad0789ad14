package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/charonlimit/charon/internal/redistest"
	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/storetest"
	"github.com/charonlimit/charon/tiers"
)

// TestPipelinedConcurrent runs 64 concurrent callers, each deciding 15
// times on its own key (limit 10) and on one shared key (limit 100): every
// answer is exact, and the commands went as one call of the decide function
// per decision, those of callers that met in one call of the batch
// function.
func TestPipelinedConcurrent(t *testing.T) {
	_, c := singleClient(t)
	var cnt counter
	c.AddHook(cnt.hook())
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
	if cnt.batches == 0 {
		t.Error("no calls went in a batch")
	}
	t.Logf("%d decisions in %d pipelines and %d batches", 2*callers*calls, pipes, cnt.batches)
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

func (g *gate) hook() *redistest.Hook {
	return &redistest.Hook{Pipeline: func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
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
	}}
}

// TestPipelineCancelledCaller holds a dispatcher's pipeline in flight: its
// caller, cancelled, returns at once; a caller queued behind it and
// cancelled returns at once and is not sent, stuck behind a pipeline Redis
// has not answered (store.ErrStuck); another queued caller is
// answered once the pipeline returns; the held call ran, and what it
// granted, which its caller was never told, was given back.
func TestPipelineCancelledCaller(t *testing.T) {
	_, c := singleClient(t)
	var g gate
	c.AddHook(g.hook())
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
	if r := <-b; !errors.Is(r.err, context.Canceled) || !errors.Is(r.err, store.ErrNotSent) || !errors.Is(r.err, store.ErrStuck) {
		t.Fatalf("queued caller: %+v, want context.Canceled and ErrNotSent, stuck (behind A's pipeline, sent before it was queued)", r)
	}
	close(g.release)
	r := <-cc
	if r.err != nil {
		t.Fatal(r.err)
	}
	// 1 (load) + 1 (C), and A's 1 unless its refund, which takes its own
	// round trip, came first; B's 3 were not sent.
	if !r.d.OK || r.d.TierHits < 2 || r.d.TierHits > 3 {
		t.Fatalf("queued caller: %+v, want granted with 2 or 3 hits", r.d)
	}
	waitLateGrants(t, s, 1)
	it := item(lyft, "a", "x", 1)
	v, err := s.Inspect(context.Background(), storetest.T0, &it)
	if err != nil {
		t.Fatal(err)
	}
	if h := v.Tiers[0].Hits; h != 2 {
		t.Errorf("the pair holds %d hits once A's grant was given back, want 2 (the load's and C's)", h)
	}
}

// TestBatchFunction demands of the batch function (fbatch in apply.lua)
// the replies and stored states of the same calls made one FCALL at a
// time: random batches of calls of one to three items (one-tier, two-tier,
// fixed-window and token-bucket policies, refunds, items that cannot be
// granted), some on keys shared between the calls of a batch, each batch
// holding a malformed call that answers its error while the others are
// made.
func TestBatchFunction(t *testing.T) {
	_, c := singleClient(t)
	ctx := context.Background()
	if err := lib.Load(ctx, c); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(21, 23))
	pols := []*tiers.Policy{
		{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 5, Window: time.Second, Active: tiers.Unbounded}}},
		{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 3, Window: time.Second, Active: tiers.Unbounded}, {Limit: 9, Window: time.Second, Active: 2 * time.Second, Cooldown: time.Second}}},
		{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Limit: 4, Unit: tiers.UnitSecond}},
		{Kind: tiers.KindTokenBucket, Bucket: tiers.TokenBucket{Capacity: 6, Refill: 2, Per: time.Second}},
	}
	for i, p := range pols {
		q, err := tiers.Normalize(*p)
		if err != nil {
			t.Fatal(err)
		}
		pols[i] = &q
	}
	now := time.Now().Add(time.Hour).UnixMicro()
	errs := 0
	for batch := range 60 {
		type fcall struct {
			keys []string
			argv []any
		}
		var calls []fcall
		bad := r.IntN(8)
		for j := range 8 {
			now += r.Int64N(150_000)
			n := 1 + r.IntN(3)
			h := header{mode: modeDecide, now: now, maxTTL: 3_600_000, lease: 1000, nk: n}
			var keys []string
			argv := []any{nil, ""}
			for i := range n {
				keys = append(keys, fmt.Sprintf("%d:%d", batch, r.IntN(6)))
				var f int64
				if r.IntN(10) == 0 {
					f = 1 // refund
				}
				hits := 1 + r.Int64N(2)
				if r.IntN(15) == 0 {
					hits = 50
				}
				h.items = append(h.items, item1(i+1, 0, i+1, hits, hits, f))
				argv = append(argv, encodePolicy(pols[r.IntN(len(pols))], time.Time{}).arg)
			}
			hdr := planned(h)
			if j == bad {
				hdr = hdr[:20] // malformed: the call fails
			}
			argv[0] = string(hdr)
			calls = append(calls, fcall{keys, argv})
		}
		// One at a time, on keys prefixed "one:".
		var want []string
		for _, cl := range calls {
			args := []any{"fcall", funcName, len(cl.keys)}
			for _, k := range cl.keys {
				args = append(args, "one:"+k)
			}
			rep, err := c.Do(ctx, append(args, cl.argv...)...).Text()
			if err != nil {
				rep = "error"
			}
			want = append(want, rep)
		}
		// As one batch, on keys prefixed "batch:".
		args := []any{"fcall", batchName, 0}
		var hdr []byte
		hdr = appendF64(hdr, int64(len(calls)))
		nk := 0
		for _, cl := range calls {
			for _, k := range cl.keys {
				args = append(args, "batch:"+k)
			}
			nk += len(cl.keys)
			hdr = appendF64(appendF64(hdr, int64(len(cl.keys))), int64(len(cl.argv)))
		}
		args[2] = nk
		args = append(args, string(hdr))
		for _, cl := range calls {
			args = append(args, cl.argv...)
		}
		res, err := c.Do(ctx, args...).Text()
		if err != nil {
			t.Fatalf("batch %d: %v", batch, err)
		}
		rest := res
		for j := range calls {
			l := f64at([]byte(rest), 0)
			rest = rest[8:]
			got := ""
			if l < 0 {
				got, rest = "error", rest[-l:]
				errs++
			} else {
				got, rest = rest[:l], rest[l:]
			}
			if got != want[j] {
				t.Fatalf("batch %d call %d: %x, one at a time %x", batch, j, got, want[j])
			}
		}
		if rest != "" {
			t.Fatalf("batch %d: %d bytes left over", batch, len(rest))
		}
		for k := range 6 {
			a, ae := stored(t, c, fmt.Sprintf("one:%d:%d", batch, k))
			b, be := stored(t, c, fmt.Sprintf("batch:%d:%d", batch, k))
			if a != b || ae != be {
				t.Fatalf("batch %d key %d: %x expiring %d, one at a time %x expiring %d", batch, k, b, be, a, ae)
			}
		}
	}
	if errs != 60 {
		t.Errorf("%d calls answered an error, want the 60 malformed ones", errs)
	}

	// On Redis's clock the calls of a batch decide at one instant.
	h := one(modeDecide, -1, 3_600_000, 1000, 0, 1, 1, 0)
	hdr := appendF64(nil, 3)
	args := []any{"fcall", batchName, 3, "clock:a", "clock:b", "clock:c"}
	for range 3 {
		hdr = appendF64(appendF64(hdr, 1), 3)
	}
	args = append(args, string(hdr))
	for range 3 {
		args = append(args, string(h), "", encodePolicy(pols[0], time.Time{}).arg)
	}
	res, err := c.Do(ctx, args...).Text()
	if err != nil {
		t.Fatal(err)
	}
	var at []int64
	for rest := res; rest != ""; {
		l := f64at([]byte(rest), 0)
		at = append(at, f64at([]byte(rest[8:]), 1))
		rest = rest[8+l:]
	}
	if len(at) != 3 || at[0] != at[1] || at[1] != at[2] || at[0] <= 0 {
		t.Errorf("instants %v, want one Redis instant for the batch", at)
	}
}

// TestBatchLoadsFunction: when Redis lacks the library (FUNCTION FLUSH), a
// batch loads it and its calls are made, and concurrent callers are all
// answered.
func TestBatchLoadsFunction(t *testing.T) {
	n, c := singleClient(t)
	s := testStore(t, c, Options{Clock: ClockCaller})

	// A batch of two calls meeting no function: loaded, then both made.
	if out, err := redistest.CLI(n.Port, "function", "flush"); err != nil {
		t.Fatalf("FUNCTION FLUSH: %v %s", err, out)
	}
	h := one(modeDecide, storetest.T0.UnixMicro(), 3_600_000, 1000, 0, 1, 1, 0)
	d := &dispatcher{sent: []bool{true, true}, idx: []int{0, 1}}
	for _, k := range []string{"reload:a", "reload:b"} {
		d.batch = append(d.batch, &request{args: []any{fcallName, funcNameArg, 1, k, h, "", encodePolicy(lyft, time.Time{}).arg}})
	}
	s.runBatch(context.Background(), d)
	for i, r := range d.batch {
		if r.err != nil || len(r.res) != 8*(replyHead+replyItem) {
			t.Fatalf("call %d of the batch: %q %v, want its reply", i, r.res, r.err)
		}
	}

	for round := range 3 {
		if out, err := redistest.CLI(n.Port, "function", "flush"); err != nil {
			t.Fatalf("FUNCTION FLUSH: %v %s", err, out)
		}
		var wg sync.WaitGroup
		errs := make(chan error, 32)
		for g := range 32 {
			wg.Go(func() {
				out := make([]tiers.Decision, 1)
				err := s.Decide(context.Background(), storetest.T0, []store.Item{item(lyft, "reload", fmt.Sprint(round, ":", g), 1)}, out)
				if err == nil && !out[0].OK {
					err = fmt.Errorf("caller %d: %+v, want granted", g, out[0])
				}
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestSplitBatch: a batch reply is split into the replies and errors of
// the calls that were sent; one that does not hold a reply per call is an
// error.
func TestSplitBatch(t *testing.T) {
	part := func(s string, errMsg bool) string {
		n := int64(len(s))
		if errMsg {
			n = -n
		}
		return string(appendF64(nil, n)) + s
	}
	newD := func() *dispatcher {
		d := &dispatcher{}
		for i := range 3 {
			d.batch = append(d.batch, &request{args: []any{i}})
			d.sent = append(d.sent, i != 1) // the second was not sent
		}
		return d
	}
	d := newD()
	if err := d.splitBatch(part("first", false)+part("boom", true), []int{0, 2}); err != nil {
		t.Fatal(err)
	}
	if d.batch[0].res != "first" || d.batch[0].err != nil || d.batch[2].err == nil || !strings.Contains(d.batch[2].err.Error(), "boom") || d.batch[1].res != "" {
		t.Errorf("split: %+v %+v %+v", d.batch[0], d.batch[1], d.batch[2])
	}
	for _, bad := range []string{"", part("first", false), part("first", false) + part("x", false) + "extra", part("first", false) + "\x00\x00"} {
		if err := newD().splitBatch(bad, []int{0, 2}); !errors.Is(err, errBatchReply) {
			t.Errorf("%q: %v, want errBatchReply", bad, err)
		}
	}
}

// TestRepliedErrors: Redis' answer about a call's data (here a state key
// holding a list) is an error wrapping store.ErrReplied, the sign that Redis
// is up, whichever way the call went: its own FCALL, a dispatcher's
// pipeline, or inside the batch function. A connection error is not.
func TestRepliedErrors(t *testing.T) {
	_, c := singleClient(t)
	for _, pipelines := range []int{-1, 1} {
		s := testStore(t, c, Options{Clock: ClockCaller, Pipelines: pipelines})
		it := item(lyft, "r", "listed", 1)
		k, _ := stateKey(s.prefix, &it)
		if err := c.RPush(context.Background(), k, "not a state").Err(); err != nil {
			t.Fatal(err)
		}
		err := s.Decide(context.Background(), storetest.T0, []store.Item{it}, make([]tiers.Decision, 1))
		if !errors.Is(err, store.ErrReplied) {
			t.Errorf("pipelines %d: a state key holding a list: %v, want store.ErrReplied", pipelines, err)
		}
	}
	// Inside the batch function: a call's negative length is its error.
	var d dispatcher
	d.batch = []*request{{}, {}}
	d.sent = []bool{true, true}
	msg := "WRONGTYPE Operation against a key holding the wrong kind of value"
	reply := string(appendF64(nil, -int64(len(msg)))) + msg + string(appendF64(nil, 2)) + "ok"
	if err := d.splitBatch(reply, []int{0, 1}); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(d.batch[0].err, store.ErrReplied) || d.batch[1].err != nil || d.batch[1].res != "ok" {
		t.Errorf("batch reply split: %v / %v %q; want ErrReplied, then the reply", d.batch[0].err, d.batch[1].err, d.batch[1].res)
	}
	if err := wrapReply(errors.New("dial tcp: connection refused")); errors.Is(err, store.ErrReplied) {
		t.Errorf("a connection error wraps store.ErrReplied: %v", err)
	}
}
