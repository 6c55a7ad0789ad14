package resilient_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/charonlimit/charon/internal/redisconn"
	"github.com/charonlimit/charon/internal/redistest"
	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/redisstore"
	"github.com/charonlimit/charon/internal/store/resilient"
	"github.com/charonlimit/charon/tiers"
)

// TestClusterReshardUnderLoad moves slots between the masters of a 3-master
// Cluster while workers decide through the production stack (the Redis
// store behind the failure-mode wrapper, local mode): no decision returns
// an error, and most are made by Redis, not by the local fallback.
func TestClusterReshardUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	nodes := redistest.Cluster(t, 3)
	remote := clusterStore(t, nodes, redisstore.Options{Clock: redisstore.ClockCaller})
	st := resilient.New(remote, resilient.Options{Timeout: time.Second, CacheSize: -1})
	defer st.Close()

	policy := &tiers.Policy{Tiers: []tiers.Tier{{Limit: 1_000_000, Window: time.Second, Active: tiers.Unbounded}}}
	var (
		calls, errs atomic.Int64
		firstErr    atomic.Value
	)
	stop := load(func(w, i int) {
		items := []store.Item{{Key: store.Key{Resource: "r", Domain: "d" + strconv.Itoa((w*7919+i)%500), PolicyID: 1},
			Policy: policy, Hits: 1, Min: 1}}
		out := make([]tiers.Decision, 1)
		err := st.Decide(context.Background(), time.Now(), items, out)
		calls.Add(1)
		if err != nil || !out[0].OK {
			errs.Add(1)
			firstErr.CompareAndSwap(nil, fmt.Sprint(err, out[0]))
		}
	})
	atLeast(t, stop, &calls, 200) // traffic before the move
	reshard(t, stop, nodes, 300, [2]int{0, 1}, [2]int{1, 2})
	atLeast(t, stop, &calls, calls.Load()+200) // traffic after the move
	stop()

	s := st.Stats()
	t.Logf("%d decisions during resharding: remote %d, local %d, remote errors %d", calls.Load(), s.Remote, s.Local, s.RemoteErrors)
	if errs.Load() != 0 {
		t.Fatalf("%d of %d decisions failed or were refused; first: %v", errs.Load(), calls.Load(), firstErr.Load())
	}
	// Slot moves are followed through MOVED/ASK redirections: Redis makes
	// the decisions throughout, the local fallback is not needed.
	if s.Remote == 0 || s.RemoteErrors*100 > s.Remote {
		t.Fatalf("remote %d, local %d, remote errors %d: Redis should have made the decisions", s.Remote, s.Local, s.RemoteErrors)
	}
}

// TestClusterReshardExactCounts moves slots back and forth while workers
// decide, with a failure mode that fails instead of deciding locally.
// Afterwards every pair must have granted exactly its limit, counting the
// grants made during the moves: a call that failed was not applied (or
// what it granted was given back), and no call was applied twice. No
// TRYAGAIN may reach the caller.
//
// With callers allowing 20 s, calls span slots too (the two-step), and a
// request's state and global keys share a slot (a multi-key call, which
// Redis answers TRYAGAIN while the slot's keys are split between two
// nodes). With callers allowing 30 ms, as Envoy's do, calls time out while
// their slot moves; those Redis applied anyway are given back when their
// replies come (redisstore's late grants; calls of one slot only: the
// two-step's commit is not given back).
func TestClusterReshardExactCounts(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	for _, tc := range []struct {
		name     string
		deadline time.Duration
		twoStep  bool
	}{{"20s", 20 * time.Second, true}, {"30ms", 30 * time.Millisecond, false}} {
		t.Run(tc.name, func(t *testing.T) { reshardExact(t, tc.deadline, tc.twoStep) })
	}
}

func reshardExact(t *testing.T, deadline time.Duration, twoStep bool) {
	nodes := redistest.Cluster(t, 3)
	remote := clusterStore(t, nodes, redisstore.Options{})
	st := resilient.New(remote, resilient.Options{Mode: resilient.ModeUnavailable, Timeout: 10 * time.Second, CacheSize: -1})
	defer st.Close()
	const limit, resources, domains = 40, 30, 4
	policy := &tiers.Policy{Tiers: []tiers.Tier{{Limit: limit, Window: time.Hour, Active: tiers.Unbounded}}, GlobalLimit: 1_000_000}
	item := func(p int) store.Item {
		return store.Item{Key: store.Key{Resource: "r" + strconv.Itoa(p/domains), Domain: "d" + strconv.Itoa(p%domains), PolicyID: 1},
			Policy: policy, Hits: 1, Min: 1}
	}
	var (
		granted  [resources * domains]atomic.Int64
		failed   atomic.Int64
		tryAgain atomic.Int64
		firstErr atomic.Value
	)
	// decide asks for pairs ps in one call (pairs of other resources are
	// in other slots: the Cluster two-step); all or nothing.
	decide := func(d time.Duration, ps ...int) (bool, error) {
		items := make([]store.Item, len(ps))
		for i, p := range ps {
			items[i] = item(p)
		}
		out := make([]tiers.Decision, len(ps))
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		err := st.Decide(ctx, time.Now(), items, out)
		for _, d := range out {
			if !d.OK {
				return false, err // an item's OK alone is what it would have been
			}
		}
		return err == nil, err
	}
	stop := load(func(w, k int) {
		i := w + 7*k
		ps := []int{i % (resources * domains)}
		if twoStep && i%2 == 1 {
			ps = append(ps, (ps[0]+domains)%(resources*domains))
		}
		ok, err := decide(deadline, ps...)
		switch {
		case err != nil:
			failed.Add(1)
			if strings.Contains(err.Error(), "TRYAGAIN") {
				tryAgain.Add(1)
			}
			firstErr.CompareAndSwap(nil, err.Error())
		case ok:
			for _, p := range ps {
				granted[p].Add(1)
			}
		}
	})
	reshard(t, stop, nodes, 1000, [2]int{0, 1}, [2]int{1, 0}, [2]int{2, 1}, [2]int{1, 2})
	stop()
	// Every late reply read and given back: the store settles.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := st.Settle(ctx); err != nil {
		t.Fatalf("the store did not settle: %v", err)
	}
	given, refundFailed := remote.LateGrants()
	lost := remote.LateLost()
	t.Logf("reliability: resharding 4000 slots under load, callers allowing %v: %d calls failed (%d TRYAGAIN), %d applied late and given back (%d refunds failed, %d replies lost); first: %v",
		deadline, failed.Load(), tryAgain.Load(), given, refundFailed, lost, firstErr.Load())
	if refundFailed > 0 {
		t.Errorf("%d refunds of late grants failed", refundFailed)
	}
	if tryAgain.Load() > 0 {
		t.Errorf("%d calls failed with TRYAGAIN: a reshard must be invisible", tryAgain.Load())
	}
	// A busy machine may have opened the breaker on timeouts: the probe
	// (redisbackend's, in production) closes it.
	for end := time.Now().Add(30 * time.Second); st.Stats().Breaker != resilient.BreakerClosed; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the breaker stayed open after the moves")
		}
		st.Probe(context.Background())
	}
	// Take what is left of every pair: the grants must add up to the limit.
	// A late call whose reply never came (LateLost: Redis answered more
	// than a second past its batch's deadline) may have been applied: each
	// such call may make one pair short of one grant, never over.
	short := uint64(0)
	for p := range granted {
		for {
			ok, err := decide(20*time.Second, p)
			if err != nil {
				t.Fatalf("pair %d after the moves: %v", p, err)
			}
			if !ok {
				break
			}
			granted[p].Add(1)
		}
		switch g := granted[p].Load(); {
		case g > limit:
			t.Errorf("pair %d granted %d in all, want %d: a call was applied twice", p, g, limit)
		case g < limit:
			short += uint64(limit - g)
		}
	}
	if short > lost {
		t.Errorf("the pairs are %d grants short of their limits, with %d late replies lost: a call was applied and not given back", short, lost)
	}
}

// atLeast waits until *calls reaches n, with a generous deadline; when it
// passes, it stops the load and fails the test.
func atLeast(t *testing.T, stop func(), calls *atomic.Int64, n int64) {
	t.Helper()
	for end := time.Now().Add(60 * time.Second); calls.Load() < n; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			stop()
			t.Fatalf("%d calls in 60 s, want %d", calls.Load(), n)
		}
	}
}

// clusterStore opens a client of the Cluster nodes (package redisconn, as a
// process does) and a Redis store over it; the client is closed when the
// test ends, after the store.
func clusterStore(t *testing.T, nodes []*redistest.Node, opts redisstore.Options) *redisstore.Store {
	t.Helper()
	c, err := redisconn.Open(redisconn.Options{ClusterAddrs: redistest.Addrs(nodes)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s, err := redisstore.NewWithClient(c, opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// load calls work(w, i) for i = 0, 1, ... on each of 8 workers w until
// the stop it returns is called; stop waits for the calls in progress and
// may be called more than once.
func load(work func(w, i int)) (stop func()) {
	var (
		stopped atomic.Bool
		wg      sync.WaitGroup
	)
	for w := range 8 {
		wg.Go(func() {
			for i := 0; !stopped.Load(); i++ {
				work(w, i)
			}
		})
	}
	return func() {
		stopped.Store(true)
		wg.Wait()
	}
}

// reshard moves slots hash slots between the masters of nodes, from
// moves[k][0] to moves[k][1] in turn; when a move fails it stops the load
// and fails the test.
func reshard(t *testing.T, stop func(), nodes []*redistest.Node, slots int, moves ...[2]int) {
	t.Helper()
	for _, mv := range moves {
		if err := redistest.Reshard(nodes[mv[0]], nodes[mv[1]], slots); err != nil {
			stop()
			t.Fatal(err)
		}
	}
}
