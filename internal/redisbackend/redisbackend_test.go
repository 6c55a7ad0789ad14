package redisbackend

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/charonlimit/charon/copylog"
	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/redisconn"
	"github.com/charonlimit/charon/internal/redistest"
	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/resilient"
	"github.com/charonlimit/charon/tiers"
)

// TestMain fails the package's tests if any goroutine outlives them, but
// for go-redis' background redial of a killed server, which sleeps out its
// backoff before it sees the closed pool.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}

func open(t *testing.T) *Backend {
	t.Helper()
	n := redistest.Single(t)
	b, err := Open(Options{Conn: redisconn.Options{URL: "redis://" + n.Addr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// gathered is the value of the unlabelled gauge or counter name.
func gathered(t *testing.T, reg *prometheus.Registry, name string) (float64, bool) {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name || len(f.GetMetric()) != 1 {
			continue
		}
		mt := f.GetMetric()[0]
		if g := mt.GetGauge(); g != nil {
			return g.GetValue(), true
		}
		if c := mt.GetCounter(); c != nil {
			return c.GetValue(), true
		}
	}
	return 0, false
}

// TestOneClientBothStores: the rate-limit store and the copy store work
// over the one client, and both stores' metrics are registered.
func TestOneClientBothStores(t *testing.T) {
	b := open(t)
	reg := prometheus.NewRegistry()
	b.Register(reg)
	p := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 2, Window: time.Minute, Active: tiers.Unbounded}}}
	items := []store.Item{{Key: store.Key{Resource: "r", Domain: "d", PolicyID: 1}, Policy: p, Hits: 1, Min: 1}}
	out := make([]tiers.Decision, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, want := range []bool{true, true, false} {
		if err := b.Store().Decide(ctx, time.Now(), items, out); err != nil || out[0].OK != want {
			t.Fatalf("decision %d: %+v %v, want OK %v", i, out[0], err, want)
		}
	}
	if got, _ := gathered(t, reg, `charon_store_breaker_opens_total`); got != 0 {
		t.Errorf("breaker opened %v times", got)
	}
	res, err := b.Copies().Reserve(ctx, time.Now(), "seat", &copylog.Config{DomainLimit: 10},
		copylog.ReserveRequest{Domain: "d", Copies: 3, HoldID: "h", Lease: time.Minute})
	if err != nil || !res.OK {
		t.Fatalf("reserve: %+v %v", res, err)
	}
	if err := b.Copies().Sweep(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	if got, ok := gathered(t, reg, "charon_copystore_holds"); !ok || got != 1 {
		t.Errorf("charon_copystore_holds = %v (found %v), want 1", got, ok)
	}
	if got := b.Copies().Stats().Live.Copies; got != 3 {
		t.Errorf("copies held after a sweep = %v, want 3", got)
	}
}

// TestCopyMetricsFollowSweeps: the copy store's gauges follow the sweeps,
// and a hold whose lease lapsed is reaped and counted.
func TestCopyMetricsFollowSweeps(t *testing.T) {
	b := open(t)
	reg := prometheus.NewRegistry()
	b.Register(reg)
	ctx := context.Background()
	cfg := &copylog.Config{DomainLimit: 10}
	for _, h := range []struct {
		id    string
		lease time.Duration
	}{{"short", 2 * time.Second}, {"long", time.Minute}} {
		res, err := b.Copies().Reserve(ctx, time.Now(), "seat", cfg, copylog.ReserveRequest{Domain: "d", Copies: 3, HoldID: h.id, Lease: h.lease})
		if err != nil || !res.OK {
			t.Fatalf("reserve %s: %+v %v", h.id, res, err)
		}
	}
	if err := b.Copies().Sweep(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	if got := b.Copies().Stats().Live.Copies; got != 6 {
		t.Fatalf("copies held after a sweep = %v, want 6", got)
	}
	// The short lease lapses by Redis time; a sweep reaps it.
	deadline := time.Now().Add(60 * time.Second)
	for b.Copies().Stats().Live.Copies != 3 {
		if err := b.Copies().Sweep(ctx, time.Now()); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("copies held %v 60 s after the short lease, want 3", b.Copies().Stats().Live.Copies)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for name, want := range map[string]float64{"charon_copystore_holds": 1, "charon_copystore_reaped_holds_total": 1} {
		if got, ok := gathered(t, reg, name); !ok || got != want {
			t.Errorf("%s = %v (found %v), want %v", name, got, ok, want)
		}
	}
	if got, _ := gathered(t, reg, "charon_copystore_sweeps_total"); got < 2 {
		t.Errorf("charon_copystore_sweeps_total = %v, want at least 2", got)
	}
}

// TestSetTree: a new configuration empties the over-limit cache, and the
// reaper sweeps only while copy-limited resources are configured.
func TestSetTree(t *testing.T) {
	b := open(t)
	p := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 1, Window: time.Minute, Active: tiers.Unbounded}}}
	items := []store.Item{{Key: store.Key{Resource: "r", Domain: "d", PolicyID: 1}, Policy: p, Hits: 1, Min: 1}}
	out := make([]tiers.Decision, 1)
	for range 2 {
		if err := b.Store().Decide(context.Background(), time.Now(), items, out); err != nil {
			t.Fatal(err)
		}
	}
	if n := b.Store().Stats().CacheSize; n != 1 {
		t.Fatalf("cache size %d after a rejection, want 1", n)
	}
	withCopies, err := descriptors.NewTree([]descriptors.DomainSpec{{Config: descriptors.DomainConfig{Name: "c"}, Nodes: []*descriptors.Node{
		{Key: "db", Limit: &descriptors.Limit{Copies: &descriptors.Copies{DomainLimit: 3}}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	b.SetTree(withCopies)
	if n := b.Store().Stats().CacheSize; n != 0 {
		t.Errorf("cache size %d after SetTree, want 0", n)
	}
	if !b.reaping.Load() {
		t.Error("not reaping with a copy-limited resource configured")
	}
	b.SetTree(nil)
	if b.reaping.Load() {
		t.Error("reaping with no copy-limited resource configured")
	}
}

// TestRunReportsServing: Run reports NOT_SERVING in the unavailable mode
// once Redis is gone, and stops when asked.
func TestRunReportsServing(t *testing.T) {
	n := redistest.Single(t)
	b, err := Open(Options{Conn: redisconn.Options{URL: "redis://" + n.Addr()}, FailureMode: resilient.ModeUnavailable})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	serving := make(chan bool, 10)
	stop := b.Run(context.Background(), func(v bool) { serving <- v })
	defer stop()
	n.Kill()
	p := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 1, Window: time.Minute, Active: tiers.Unbounded}}}
	items := []store.Item{{Key: store.Key{Resource: "r", Domain: "d", PolicyID: 1}, Policy: p, Hits: 1, Min: 1}}
	out := make([]tiers.Decision, 1)
	deadline := time.Now().Add(60 * time.Second)
	for {
		_ = b.Store().Decide(context.Background(), time.Now(), items, out)
		select {
		case v := <-serving:
			if v {
				t.Fatal("reported SERVING with Redis gone")
			}
			return
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("NOT_SERVING not reported 60 s after Redis was killed")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRunSweeps: while copy-limited resources are configured, Run sweeps
// the copy logs every SweepInterval.
func TestRunSweeps(t *testing.T) {
	b := open(t)
	b.reaping.Store(true)
	stop := b.Run(context.Background(), nil)
	defer stop()
	deadline := time.Now().Add(60 * time.Second)
	for b.Copies().Stats().Sweeps < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d sweeps 60 s after Run, want 2", b.Copies().Stats().Sweeps)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRefusedIsDown: with Redis killed (by PID), refused and reset
// connections are Redis' answer that it is down: each of 50 sequential
// calls allowing 10 s is answered by the failure mode long before its
// deadline (none waited for it: no timeout is counted), and go-redis
// dials at most twice per call, once per pool (a pipeline tries go-redis'
// pipeline pool, then its main pool, at once): no refused dial retried
// after a backoff, no command retried on a new connection (go-redis' retries
// would make it 4 attempts of 2 dials). The breaker opens on those answers.
func TestRefusedIsDown(t *testing.T) {
	n := redistest.Single(t)
	b, err := Open(Options{Conn: redisconn.Options{URL: "redis://" + n.Addr()}, FailureMode: resilient.ModeOpen, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	h := &redistest.Hook{}
	b.client.AddHook(h)
	p := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 1, Window: time.Minute, Active: tiers.Unbounded}}}
	out := make([]tiers.Decision, 1)
	decide := func(domain string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		items := []store.Item{{Key: store.Key{Resource: "r", Domain: domain, PolicyID: 1}, Policy: p, Hits: 1, Min: 1}}
		err := b.Store().Decide(ctx, time.Now(), items, out)
		if ctx.Err() != nil {
			t.Fatalf("a call on %s waited for its deadline", domain)
		}
		return err
	}
	if err := decide("warm"); err != nil || !out[0].OK || b.Store().Stats().Remote != 1 {
		t.Fatalf("before the kill: %v %+v, %+v", err, out[0], b.Store().Stats())
	}
	n.Kill()
	for i := range 50 {
		before, _ := h.Dials()
		// A domain of its own: an answer of Redis would grant it, as the
		// open mode does; the counters tell them apart.
		if err := decide(fmt.Sprint("d", i)); err != nil || !out[0].OK {
			t.Fatalf("call %d with Redis killed: %v %+v, want the open mode's grant", i, err, out[0])
		}
		if after, _ := h.Dials(); after-before > 2 {
			t.Errorf("call %d dialled %d times: a refused dial was retried", i, after-before)
		}
	}
	st := b.Store().Stats()
	if st.Open != 50 || st.Remote != 1 || st.Timeouts != 0 {
		t.Errorf("stats %+v: want 50 calls answered by the open mode, none remote after the kill, no timeout", st)
	}
	if st.Breaker != resilient.BreakerOpen {
		t.Errorf("breaker %v after 50 refused calls, want open", st.Breaker)
	}
	dials, failed := h.Dials()
	t.Logf("50 calls with Redis killed: %d dials, %d failed; %d remote errors before the breaker opened", dials, failed, st.RemoteErrors)
}

// TestRefusedIsDownCluster: TestRefusedIsDown on a Redis Cluster, one
// master killed. go-redis' Cluster client sends a command again when its
// node cannot be reached (up to MaxRedirects times); with its default
// backoff before each attempt (10 ms growing to 1 s) a call on a killed
// master's slot took 60 to 160 ms before the failure mode answered it.
// Here the attempts are refused at once: fewer than half the calls Redis
// failed may take that backoff's least total (10 + 10 + 10 ms), for a slow
// machine's stalls; with the backoff every one of them did.
func TestRefusedIsDownCluster(t *testing.T) {
	nodes := redistest.Cluster(t, 3)
	b, err := Open(Options{Conn: redisconn.Options{URL: "redis-cluster://" + nodes[0].Addr()}, FailureMode: resilient.ModeOpen, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	p := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 1, Window: time.Minute, Active: tiers.Unbounded}}}
	out := make([]tiers.Decision, 1)
	decide := func(domain string) (time.Duration, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		items := []store.Item{{Key: store.Key{Resource: "r", Domain: domain, PolicyID: 1}, Policy: p, Hits: 1, Min: 1}}
		start := time.Now()
		err := b.Store().Decide(ctx, time.Now(), items, out)
		if ctx.Err() != nil {
			t.Fatalf("a call on %s waited for its deadline", domain)
		}
		return time.Since(start), err
	}
	// Warm the pools of every master.
	for i := range 200 {
		if _, err := decide(fmt.Sprint("w", i)); err != nil || !out[0].OK {
			t.Fatalf("warm %d: %v %+v", i, err, out[0])
		}
	}
	nodes[1].Kill()
	// The calls Redis failed (the killed master's slots, before the breaker
	// opens): each slept the backoff three times (at least 30 ms) before.
	var failed, slow []time.Duration
	for i := range 200 {
		errs := b.Store().Stats().RemoteErrors
		d, err := decide(fmt.Sprint("d", i))
		if err != nil || !out[0].OK {
			t.Fatalf("call %d with a master killed: %v %+v", i, err, out[0])
		}
		if b.Store().Stats().RemoteErrors > errs {
			failed = append(failed, d)
			if d >= 30*time.Millisecond {
				slow = append(slow, d)
			}
		}
	}
	st := b.Store().Stats()
	// The breaker opens only on five failures in a row: calls on the other
	// masters' slots, which Redis answers, come between them.
	t.Logf("200 calls, a master killed (200 before it): %d remote, %d by the open mode, %d remote errors, breaker %v; of the calls Redis failed, 30 ms or more: %v",
		st.Remote, st.Open, st.RemoteErrors, st.Breaker, slow)
	if st.Open == 0 || st.Open+st.Remote != 400 {
		t.Errorf("stats %+v: want every call answered, the killed master's by the open mode", st)
	}
	// Every one of them took 30 ms or more with the backoff; a slow
	// machine may stall some for as long, not most.
	if len(failed) == 0 || 2*len(slow) > len(failed) {
		t.Errorf("%d of the %d calls Redis failed took 30 ms or more: %v", len(slow), len(failed), slow)
	}
}
