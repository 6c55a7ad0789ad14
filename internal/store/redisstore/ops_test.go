package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/charonlimit/charon/internal/redisconn"
	"github.com/charonlimit/charon/internal/redistest"
	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/storetest"
	"github.com/charonlimit/charon/tiers"
)

// counter is a go-redis hook counting the commands sent, by name, and the
// pipelines. The handshake of a new connection (HELLO, CLIENT) is not
// counted.
type counter struct {
	mu      sync.Mutex
	n       map[string]int
	pipes   int
	batches int
}

func (c *counter) hook() *redistest.Hook {
	return &redistest.Hook{
		Process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
			// A call of the batch function counts as the FCALLs it makes.
			if a := cmd.Args(); len(a) > 3 && a[1] == batchNameArg {
				hdr := a[3+a[2].(int)].([]byte)
				for range f64at(hdr, 0) {
					c.add("fcall")
				}
				c.mu.Lock()
				c.batches++
				c.mu.Unlock()
				return next(ctx, cmd)
			}
			c.add(cmd.Name())
			return next(ctx, cmd)
		},
		Pipeline: func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
			c.mu.Lock()
			c.pipes++
			c.mu.Unlock()
			for _, cmd := range cmds {
				c.add(cmd.Name())
			}
			return next(ctx, cmds)
		},
	}
}
func (c *counter) add(name string) {
	name = strings.ToLower(name)
	if name == "hello" || name == "client" {
		return
	}
	c.mu.Lock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[name]++
	c.mu.Unlock()
}
func (c *counter) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.n
	c.n = nil
	c.pipes = 0
	return n
}

// takePipes returns the pipelines counted since the last take.
func (c *counter) takePipes() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pipes
}

var (
	lyft    = &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 10, Window: time.Second, Active: tiers.Unbounded}}}
	twoTier = &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{
		{Limit: 5, Window: time.Second, Active: tiers.Unbounded},
		{Limit: 50, Window: time.Minute, Active: 10 * time.Minute, Cooldown: 10 * time.Minute}}}
	withGlobal = &tiers.Policy{Kind: tiers.KindTiers, GlobalLimit: 100, HardLimit: 20, Tiers: []tiers.Tier{{Limit: 10, Window: time.Second, Active: tiers.Unbounded}}}
)

func item(p *tiers.Policy, res, dom string, hits int64) store.Item {
	return store.Item{Key: store.Key{Resource: res, Domain: dom, PolicyID: 7}, Policy: p, Hits: hits, Min: hits}
}

// TestOneCommandPerDecide counts the commands of a Decide: one FCALL for a
// call of several items in one slot, Redis clock or caller's, sent in a
// pipeline by a dispatcher (or on its own with the dispatchers off).
func TestOneCommandPerDecide(t *testing.T) {
	_, c := singleClient(t)
	var cnt counter
	c.AddHook(cnt.hook())
	for _, pipelines := range []int{0, -1} {
		wantPipes := 1
		if pipelines < 0 {
			wantPipes = 0
		}
		check := func(clock Clock, what string, i int) {
			t.Helper()
			pipes := cnt.takePipes()
			if got := cnt.take(); len(got) != 1 || got["fcall"] != 1 || pipes != wantPipes {
				t.Fatalf("pipelines %d, clock %d, %s %d: commands %v in %d pipelines, want exactly one fcall in %d",
					pipelines, clock, what, i, got, pipes, wantPipes)
			}
		}
		for _, clock := range []Clock{ClockRedis, ClockCaller} {
			s := testStore(t, c, Options{Clock: clock, Pipelines: pipelines})
			storetest.Decide(t, s, storetest.T0, item(lyft, "a", "x", 1)) // loads the function on first use
			cnt.take()
			for i := range 20 {
				storetest.Decide(t, s, storetest.T0, item(lyft, "a", fmt.Sprint("x", i%3), 1), item(withGlobal, "b", "y", 2), item(twoTier, "c", "z", 1))
				check(clock, "call", i)
				storetest.Decide(t, s, storetest.T0, item(twoTier, "c", fmt.Sprint("z", i), 1))
				check(clock, "single item", i)
			}
			s.Close()
		}
	}
}

// TestFunctionReload removes the decide function from Redis (FUNCTION
// FLUSH, then a restart of a server without persistence): the next Decide
// loads it again transparently (FCALL answered "Function not found", then
// FUNCTION LOAD and FCALL again), and the following ones are one FCALL.
func TestFunctionReload(t *testing.T) {
	n, args := redistest.SingleArgs(t)
	c := redistest.Client(t, n)
	var cnt counter
	c.AddHook(cnt.hook())
	s := testStore(t, c, Options{Clock: ClockCaller})
	if err := s.Load(context.Background()); err != nil {
		t.Fatalf("Load: %v", err)
	}
	cnt.take()
	storetest.Decide(t, s, storetest.T0, item(lyft, "a", "x", 3))
	if got := cnt.take(); len(got) != 1 || got["fcall"] != 1 {
		t.Fatalf("commands %v after Load, want one fcall", got)
	}
	wantHits := int64(3)
	for _, lose := range []string{"flush", "restart"} {
		switch lose {
		case "flush":
			if out, err := redistest.CLI(n.Port, "function", "flush"); err != nil {
				t.Fatalf("FUNCTION FLUSH: %v %s", err, out)
			}
		case "restart":
			n.Kill()
			n.Restart(t, args...)
			wantHits = 0 // the server kept no data either
		}
		cnt.take()
		d := storetest.Decide(t, s, storetest.T0, item(lyft, "a", "x", 3))[0]
		if wantHits += 3; !d.OK || d.TierHits != wantHits {
			t.Fatalf("after %s: %+v, want granted with %d hits in the tier", lose, d, wantHits)
		}
		got := cnt.take()
		if got["fcall"] != 2 || got["function"] != 1 || len(got) != 2 {
			t.Fatalf("after %s: commands %v, want fcall, function load, fcall", lose, got)
		}
		storetest.Decide(t, s, storetest.T0, item(lyft, "a", "x", 1))
		if got := cnt.take(); len(got) != 1 || got["fcall"] != 1 {
			t.Fatalf("after %s: commands %v, want one fcall once reloaded", lose, got)
		}
		wantHits++
	}
}

// TestPingLoadsFunction: Ping, the breaker's probe, loads the decide
// function where Redis lacks it (PING, FUNCTION LIST, FUNCTION LOAD), so the
// first decision after a Redis restart is one FCALL; where Redis has it,
// Ping loads nothing.
func TestPingLoadsFunction(t *testing.T) {
	n := redistest.Single(t)
	c := redistest.Client(t, n)
	var cnt counter
	c.AddHook(cnt.hook())
	s := testStore(t, c, Options{Clock: ClockCaller})
	ctx := context.Background()
	if out, err := redistest.CLI(n.Port, "function", "flush"); err != nil {
		t.Fatalf("FUNCTION FLUSH: %v %s", err, out)
	}
	cnt.take()
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	if got := cnt.take(); got["ping"] != 1 || got["function"] != 2 || len(got) != 2 {
		t.Fatalf("Ping without the function: commands %v, want ping, function list, function load", got)
	}
	storetest.Decide(t, s, storetest.T0, item(lyft, "a", "x", 1))
	if got := cnt.take(); len(got) != 1 || got["fcall"] != 1 {
		t.Fatalf("decision after Ping: commands %v, want one fcall", got)
	}
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	if got := cnt.take(); got["ping"] != 1 || got["function"] != 1 || len(got) != 2 {
		t.Fatalf("Ping with the function loaded: commands %v, want ping, function list", got)
	}
	s.Close()
	if err := s.Ping(ctx); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Ping after Close = %v, want store.ErrClosed", err)
	}
}

// TestEveryKeyHasTTL decides with the Redis clock over policies of every
// kind (a tier kept for ever by tiers included) and checks that every key
// expires, no later than MaxTTL.
func TestEveryKeyHasTTL(t *testing.T) {
	_, c := singleClient(t)
	forever := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{
		{Limit: 1, Window: time.Second, Active: tiers.Unbounded},
		{Limit: 5, Window: time.Second, Active: tiers.Unbounded}}}
	bucket := &tiers.Policy{Kind: tiers.KindTokenBucket, Bucket: tiers.TokenBucket{Capacity: 10, Refill: 1, Per: time.Second}}
	fixed := &tiers.Policy{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Limit: 10, Unit: tiers.UnitHour}}
	s := testStore(t, c, Options{KeyPrefix: "ttl:", MaxTTL: time.Hour})
	for i := range 4 {
		for _, p := range []*tiers.Policy{lyft, twoTier, withGlobal, forever, bucket, fixed} {
			storetest.Decide(t, s, time.Time{}, item(p, fmt.Sprintf("r%p", p), fmt.Sprint("d", i), 2))
		}
	}
	ctx := context.Background()
	keys, err := c.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) < 20 {
		t.Fatalf("%d keys, want at least 20: %v", len(keys), keys)
	}
	for _, k := range keys {
		ttl, err := c.PTTL(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ttl <= 0 || ttl > time.Hour {
			t.Errorf("key %q: TTL %v, want in (0, 1h]", k, ttl)
		}
	}
}

// TestRedisClock decides on the Redis clock: Decide's now is ignored.
func TestRedisClock(t *testing.T) {
	_, c := singleClient(t)
	s := testStore(t, c, Options{})
	p := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 2, Window: time.Hour, Active: tiers.Unbounded}}}
	for i, now := range []time.Time{{}, storetest.T0, time.Unix(1, 0)} {
		d := storetest.Decide(t, s, now, item(p, "clock", "d", 1))[0]
		if wantOK := i < 2; d.OK != wantOK {
			t.Fatalf("call %d: %+v, want OK %v", i, d, wantOK)
		}
		if i == 2 && (d.RetryAfter <= 59*time.Minute || d.RetryAfter > time.Hour) {
			t.Fatalf("RetryAfter %v, want about an hour from Redis's now", d.RetryAfter)
		}
	}
}

// TestRedisClockFixed: on the Redis clock a fixed window's count, kept in
// place, grants exactly its limit, gives a refund back, shows in Inspect and
// expires at its window's end.
func TestRedisClockFixed(t *testing.T) {
	_, c := singleClient(t)
	s := testStore(t, c, Options{})
	ctx := context.Background()
	p := &tiers.Policy{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Limit: 3, Unit: tiers.UnitDay}}
	it := item(p, "clockfixed", "d", 1)
	granted := 0
	for range 5 {
		if d := storetest.Decide(t, s, time.Time{}, it)[0]; d.OK {
			granted++
		}
	}
	// A day's window: the calls straddle midnight (UTC) about once in 10^7
	// runs, which would grant more.
	if granted != 3 {
		t.Fatalf("granted %d of 5, want the limit, 3", granted)
	}
	refund := it
	refund.Refund = true
	storetest.Decide(t, s, time.Time{}, refund)
	if d := storetest.Decide(t, s, time.Time{}, it)[0]; !d.OK {
		t.Fatalf("after a refund: %+v, want granted", d)
	}
	v, err := s.Inspect(ctx, time.Now(), &it)
	if err != nil {
		t.Fatal(err)
	}
	if v.Used != 3 || v.Capacity != 3 || v.Remaining != 0 {
		t.Errorf("Inspect: %+v, want 3 of 3 used", v)
	}
	sk, _ := stateKey(s.prefix, &it)
	exp, err := c.PExpireTime(ctx, sk).Result()
	if err != nil {
		t.Fatal(err)
	}
	if end := time.Now().UTC().Truncate(24 * time.Hour).Add(24 * time.Hour); exp != time.Duration(end.UnixMilli())*time.Millisecond {
		t.Errorf("the count expires at %v, want the window's end %v", time.UnixMilli(exp.Milliseconds()), end)
	}
}

// TestClusterConcurrent runs calls spanning two slots concurrently with
// one-slot calls on the same hot key, on a 3-master Cluster: the hot key
// grants exactly its limit, and the other key of the two-slot calls loses
// exactly the hits of the granted ones. With plain limits the calls
// spanning slots take one round trip per slot (oneTrip), and those the hot
// key rejects give back what the other key granted (on the caller's clock
// and on Redis'); with a hard limit they take the two-step.
func TestClusterConcurrent(t *testing.T) {
	_, c := clusterClient(t)
	plain := func(limit int64) *tiers.Policy {
		return &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: limit, Window: time.Hour, Active: tiers.Unbounded}}}
	}
	hard := func(limit int64) *tiers.Policy {
		p := plain(limit)
		p.HardLimit = 10000
		return p
	}
	fixed := func(limit int64) *tiers.Policy {
		return &tiers.Policy{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Limit: limit, Unit: tiers.UnitHour}}
	}
	for _, tc := range []struct {
		name    string
		pol     func(int64) *tiers.Policy
		clock   Clock
		oneTrip bool
	}{
		{"two-step", hard, ClockCaller, false},
		{"one trip", plain, ClockCaller, true},
		{"one trip, Redis clock", plain, ClockRedis, true},
		{"one trip, fixed windows", fixed, ClockCaller, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testClusterConcurrent(t, c, tc.pol, tc.clock, tc.oneTrip)
		})
	}
}

func testClusterConcurrent(t *testing.T, c *redis.ClusterClient, pol func(int64) *tiers.Policy, clock Clock, oneTrip bool) {
	s := testStore(t, c, Options{Clock: clock})
	hot, big := pol(40), pol(1000)
	a, b := item(hot, "hot", "a", 1), item(big, "other", "b", 1)
	ka, _ := stateKey(s.prefix, &a)
	kb, _ := stateKey(s.prefix, &b)
	if slot(ka) == slot(kb) {
		t.Fatal("test keys share a slot")
	}
	var two, one atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 15 {
				items := []store.Item{b, a}
				if w%3 == 0 {
					items = []store.Item{a}
				}
				out := make([]tiers.Decision, len(items))
				if err := s.Decide(context.Background(), storetest.T0, items, out); err != nil {
					errs <- err
					return
				}
				all := true
				for _, d := range out {
					all = all && d.OK
				}
				if all && len(items) == 2 {
					two.Add(1)
				} else if all {
					one.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := two.Load() + one.Load(); got != 40 {
		t.Fatalf("%d grants of the hot key (%d two-slot, %d one-slot), want exactly 40", got, two.Load(), one.Load())
	}
	left := 1000 - two.Load()
	b.Hits, b.Min = left, left
	if d := storetest.Decide(t, s, storetest.T0, b)[0]; !d.OK {
		t.Fatalf("other key: %d hits left expected: %+v", left, d)
	}
	b.Hits, b.Min = 1, 1
	if d := storetest.Decide(t, s, storetest.T0, b)[0]; d.OK {
		t.Fatalf("other key: more than %d hits were left", left)
	}
	// No lock key is left behind.
	var locks []string
	var mu sync.Mutex
	err := c.ForEachMaster(context.Background(), func(ctx context.Context, m *redis.Client) error {
		ks, err := m.Keys(ctx, s.prefix+"lock:*").Result()
		mu.Lock()
		locks = append(locks, ks...)
		mu.Unlock()
		return err
	})
	if err != nil || len(locks) > 0 {
		t.Fatalf("lock keys left: %v (%v)", locks, err)
	}
	given, failed := s.Undone()
	if oneTrip != (given > 0) || failed > 0 {
		t.Fatalf("%d slots given back, %d failed: want some given back (one trip: %v), none failed", given, failed, oneTrip)
	}
}

// TestSentinelFailover decides through a Sentinel, kills the master, and
// expects Decide to work again through the promoted replica.
func TestSentinelFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("failover takes seconds")
	}
	set := redistest.Sentinel(t)
	s := openStore(t, redisconn.Options{
		URL:         fmt.Sprintf("redis-sentinel://%s/%s", set.Sentinel.Addr(), set.MasterName),
		DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond,
	}, Options{})
	if d := storetest.Decide(t, s, time.Time{}, item(lyft, "s", "d", 1))[0]; !d.OK {
		t.Fatalf("through sentinel: %+v", d)
	}
	set.Master.Kill()
	killed := time.Now()
	deadline := killed.Add(30 * time.Second)
	fails := 0
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		out := make([]tiers.Decision, 1)
		err := s.Decide(ctx, time.Time{}, []store.Item{item(lyft, "s", "d", 1)}, out)
		cancel()
		if err == nil {
			t.Logf("reliability: Sentinel failover: Decide works again %v after the master was killed (%d failed calls)", time.Since(killed).Round(10*time.Millisecond), fails)
			break
		}
		fails++
		if time.Now().After(deadline) {
			t.Fatalf("no Decide succeeded within 30s of the failover: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestMemoryUsage reports MEMORY USAGE per tracked pair in steady state.
func TestMemoryUsage(t *testing.T) {
	_, c := singleClient(t)
	s := testStore(t, c, Options{Clock: ClockCaller, KeyPrefix: "mem:"})
	ctx := context.Background()
	usage := func(it store.Item) int64 {
		k, _ := stateKey("mem:", &it)
		n, err := c.MemoryUsage(ctx, k).Result()
		if err != nil {
			t.Fatalf("MEMORY USAGE %s: %v", k, err)
		}
		return n
	}
	// Two tiers, limits 5 and 50: fill tier 1, burst into tier 2 and fill
	// it, one hit per 10ms.
	now := storetest.T0
	it := item(twoTier, "two", "d", 1)
	for range 55 {
		storetest.Decide(t, s, now, it)
		now = now.Add(10 * time.Millisecond)
	}
	two := usage(it)
	// One tier of 10,000 per hour: hits spread over the hour, so the log
	// holds its 64 buckets.
	big := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 10000, Window: time.Hour, Active: tiers.Unbounded}}}
	it = item(big, "big", "d", 1)
	now = storetest.T0
	for range 9000 / 50 {
		it.Hits, it.Min = 50, 50
		storetest.Decide(t, s, now, it)
		now = now.Add(20 * time.Second)
	}
	tenK, bigNow := usage(it), now
	// A Lyft rate limit of 10 per second, one hit.
	it = item(lyft, "lyft", "d", 1)
	storetest.Decide(t, s, storetest.T0, it)
	one := usage(it)
	t.Logf("MEMORY USAGE per tracked pair: 2 tiers (5, 50) full: %d bytes; 1 tier of 10,000/hour (64 buckets): %d bytes; 1 tier, 1 hit: %d bytes", two, tenK, one)
	// A pair's state is bounded whatever its limit: 9,000 hits in a
	// window cost no more than a few buckets' worth (docs/performance.md
	// has the figures; the bounds leave room for Redis's own encoding).
	if two > 4096 || tenK > 4096 || one > 512 || one >= two {
		t.Errorf("MEMORY USAGE: 2 tiers full %d, 10,000/hour %d (want both at most 4096 bytes), one hit %d (want at most 512, and less than a full state)", two, tenK, one)
	}
	// More hits into the bucketed log do not grow it past its buckets.
	bigIt := item(big, "big", "d", 50)
	for range 20 {
		bigIt.Hits, bigIt.Min = 50, 50
		storetest.Decide(t, s, bigNow, bigIt)
		bigNow = bigNow.Add(20 * time.Second)
	}
	if more := usage(bigIt); more > tenK+256 {
		t.Errorf("MEMORY USAGE of the 10,000/hour pair grew from %d to %d bytes with 1,000 more hits", tenK, more)
	}
}

// stealer is a go-redis hook that, before the first seal FCALL it sees,
// runs steal once: what happens to a two-step call whose lock lapsed
// between its prepare and its commit while another call took the key.
type stealer struct {
	once  sync.Once
	steal func()
}

func (h *stealer) hook() *redistest.Hook {
	return &redistest.Hook{Each: func(cmd redis.Cmder) {
		if mode, _, ok := fcallMode(cmd); ok && mode == modeSeal {
			h.once.Do(h.steal)
		}
	}}
}

// fcallMode returns the mode of a decide FCALL (the first number of its
// header) and its first key; ok is false for any other command.
func fcallMode(cmd redis.Cmder) (mode int64, key string, ok bool) {
	args := cmd.Args()
	if len(args) < 4 || !strings.EqualFold(fmt.Sprint(args[0]), "fcall") {
		return 0, "", false
	}
	nk := 0
	fmt.Sscan(fmt.Sprint(args[2]), &nk)
	if nk < 1 || len(args) < 4+nk {
		return 0, "", false
	}
	hdr, ok := args[3+nk].([]byte)
	if !ok || len(hdr) < 8 {
		return 0, "", false
	}
	return readF64(hdr), fmt.Sprint(args[3]), true
}

func readF64(b []byte) int64 {
	r := reader{b: string(b)}
	return int64(r.num())
}

// TestClusterTwoStepLockLapse: a two-step call whose lock lapsed after its
// prepare, while another call decided on the key, commits nothing and
// starts again: it answers as store.Apply over the new state (a rejected, so
// the call commits nothing and b keeps its hit), never ErrLockLost and never
// half committed.
func TestClusterTwoStepLockLapse(t *testing.T) {
	nodes, c := clusterClient(t)
	// A hard limit keeps the calls spanning slots on the two-step (undoable).
	one := &tiers.Policy{Kind: tiers.KindTiers, HardLimit: 1000, Tiers: []tiers.Tier{{Limit: 1, Window: time.Hour, Active: tiers.Unbounded}}}
	prefix := newPrefix()
	// The intruder has its own client, so its call does not wait behind
	// the hooked pipeline.
	c2 := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{nodes[0].Addr()}})
	t.Cleanup(func() { c2.Close() })
	intruder := testStore(t, c2, Options{Clock: ClockCaller, KeyPrefix: prefix})
	a, b := item(one, "ra", "a", 1), item(one, "rb", "b", 1)
	var stolen error
	h := &stealer{steal: func() {
		ka, _ := stateKey(prefix, &a)
		// The lock lapses, and another call takes a's only hit.
		if err := c2.Del(context.Background(), lockKey(prefix, ka)).Err(); err != nil {
			stolen = err
			return
		}
		out := make([]tiers.Decision, 1)
		stolen = intruder.Decide(context.Background(), storetest.T0, []store.Item{a}, out)
		if stolen == nil && !out[0].OK {
			stolen = errors.New("the intruder was not granted")
		}
	}}
	c.AddHook(h.hook())
	s := testStore(t, c, Options{Clock: ClockCaller, KeyPrefix: prefix})
	s.sealAfter = 0 // as if the prepares took long: the call seals
	ka, _ := stateKey(prefix, &a)
	kb, _ := stateKey(prefix, &b)
	if slot(ka) == slot(kb) {
		t.Fatal("test keys share a slot")
	}
	out := make([]tiers.Decision, 2)
	if err := s.Decide(context.Background(), storetest.T0, []store.Item{a, b}, out); err != nil {
		t.Fatalf("two-step call: %v", err)
	}
	if stolen != nil {
		t.Fatalf("intruder: %v", stolen)
	}
	if out[0].OK {
		t.Errorf("two-step call after its lock lapsed: a granted %+v, want rejected (the intruder took it)", out[0])
	}
	if d := storetest.Decide(t, s, storetest.T0, b)[0]; !d.OK {
		t.Errorf("b lost its hit to a call that was rejected: %+v", d)
	}
}

// barrier is a go-redis hook that holds every FCALL of the two-step's
// prepare, seal and commit until n of that mode have come, or until a
// generous deadline: with the steps' scripts sent for all slots at once
// they all come; sent one after another, the first would wait for ever.
type barrier struct {
	n        int
	mu       sync.Mutex
	seen     map[int64]int
	ch       map[int64]chan struct{}
	missed   []int64 // the modes whose barrier timed out
	onCommit func()  // run once, when the first commit comes
	once     sync.Once
}

func (h *barrier) hook() *redistest.Hook {
	return &redistest.Hook{Process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
		if m, _, ok := fcallMode(cmd); ok && (m == modePrepare || m == modeSeal || m == modeCommit) {
			if m == modeCommit && h.onCommit != nil {
				h.once.Do(h.onCommit)
			}
			h.wait(m)
		}
		return next(ctx, cmd)
	}}
}

func (h *barrier) wait(mode int64) {
	h.mu.Lock()
	ch := h.ch[mode]
	if ch == nil {
		ch = make(chan struct{})
		h.ch[mode] = ch
	}
	h.seen[mode]++
	if h.seen[mode] == h.n {
		close(ch)
	}
	h.mu.Unlock()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		h.mu.Lock()
		h.missed = append(h.missed, mode)
		h.mu.Unlock()
	}
}

// TestClusterTwoStepSlotsAtOnce: each step of a two-step call sends its
// scripts for all the call's slots at once (three slots here), so that the
// call holds its locks for two round trips (three with a seal), not that
// many per slot. Without the seal, the commits find the locks with most of
// their lease left.
func TestClusterTwoStepSlotsAtOnce(t *testing.T) {
	nodes, c := clusterClient(t)
	other := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{nodes[0].Addr()}})
	t.Cleanup(func() { other.Close() })
	// A hard limit keeps the calls spanning slots on the two-step (undoable).
	p := &tiers.Policy{Kind: tiers.KindTiers, HardLimit: 1000, Tiers: []tiers.Tier{{Limit: 5, Window: time.Hour, Active: tiers.Unbounded}}}
	for _, seal := range []bool{false, true} {
		h := &barrier{n: 3, seen: map[int64]int{}, ch: map[int64]chan struct{}{}}
		c.AddHook(h.hook())
		// No dispatchers: each script is sent by the goroutine that makes it.
		s := testStore(t, c, Options{Clock: ClockCaller, Pipelines: -1})
		// A seal step, or none however slow the machine.
		s.sealAfter = time.Minute
		if seal {
			s.sealAfter = 0
		}
		var items []store.Item
		slots := map[uint16]bool{}
		for i := 0; len(items) < 3; i++ {
			it := item(p, fmt.Sprintf("r%d", i), "d", 1)
			k, _ := stateKey(s.prefix, &it)
			if !slots[slot(k)] {
				slots[slot(k)] = true
				items = append(items, it)
			}
		}
		// What the locks have left when the commits are sent.
		var ttls []time.Duration
		h.onCommit = func() {
			for _, it := range items {
				k, _ := stateKey(s.prefix, &it)
				ttls = append(ttls, other.PTTL(context.Background(), lockKey(s.prefix, k)).Val())
			}
		}
		out := make([]tiers.Decision, len(items))
		if err := s.Decide(context.Background(), storetest.T0, items, out); err != nil {
			t.Fatal(err)
		}
		for i, d := range out {
			if !d.OK || d.Remaining != 4 {
				t.Errorf("seal %v: item %d: %+v, want granted with 4 left", seal, i, d)
			}
		}
		if len(h.missed) > 0 {
			t.Errorf("seal %v: steps (modes %v) sent their slots' scripts one after another, not at once", seal, h.missed)
		}
		// A node without the function yet answers the first prepare so, and
		// it is sent again once loaded.
		seals := 0
		if seal {
			seals = 3
		}
		if h.seen[modePrepare] < 3 || h.seen[modeSeal] != seals || h.seen[modeCommit] != 3 {
			t.Errorf("seal %v: scripts by mode %v, want 3 prepares (or more), %d seals, 3 commits", seal, h.seen, seals)
		}
		// The lease is ten times LockTTL (500 ms): far more than the
		// prepares took.
		for _, ttl := range ttls {
			if ttl < 2*DefaultLockTTL {
				t.Errorf("seal %v: a lock had %v to live when the commits were sent, want most of %v", seal, ttl, sealFactor*DefaultLockTTL)
			}
		}
		if len(ttls) < 3 {
			t.Errorf("seal %v: read %d lock lives, want 3 or more", seal, len(ttls))
		}
	}
}

// modeHook is a go-redis hook that counts the FCALLs of each mode by the
// state key they carry first, and runs before(mode, key) ahead of each.
type modeHook struct {
	mu     sync.Mutex
	seen   map[string]int // "mode key"
	before func(mode int64, key string)
}

func (h *modeHook) hook() *redistest.Hook {
	see := func(cmd redis.Cmder) {
		if m, k, ok := fcallMode(cmd); ok {
			h.mu.Lock()
			h.seen[fmt.Sprint(m, " ", k)]++
			h.mu.Unlock()
			if h.before != nil {
				h.before(m, k)
			}
		}
	}
	return &redistest.Hook{
		Process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
			see(cmd)
			return next(ctx, cmd)
		},
		Pipeline: func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
			for _, cmd := range cmds {
				see(cmd)
			}
			return next(ctx, cmds)
		},
	}
}

// TestClusterTwoStepBusyAgain: a two-step call that finds one slot's key
// locked by another call prepares that slot again, keeping the lock it took
// on the other slot; when the other call lets go in time, it commits
// without releasing anything or preparing the other slot twice.
func TestClusterTwoStepBusyAgain(t *testing.T) {
	c, other, s, a, b, ka, kb := twoSlots(t)
	// Load the function on every node first, so that no prepare is sent
	// twice for that.
	for _, it := range []store.Item{a, b} {
		if d := storetest.Decide(t, s, storetest.T0, it)[0]; !d.OK {
			t.Fatalf("warm-up: %+v", d)
		}
	}
	ctx := context.Background()
	// Another call holds a's key.
	if err := other.Set(ctx, lockKey(s.prefix, ka), "someone", 5*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	h := &modeHook{seen: map[string]int{}}
	var prepA atomic.Int32
	h.before = func(mode int64, key string) {
		// The other call lets go just before a's second prepare.
		if mode == modePrepare && key == ka && prepA.Add(1) == 2 {
			other.Del(ctx, lockKey(s.prefix, ka))
		}
	}
	c.AddHook(h.hook())
	out := make([]tiers.Decision, 2)
	if err := s.Decide(ctx, storetest.T0, []store.Item{a, b}, out); err != nil {
		t.Fatal(err)
	}
	if !out[0].OK || !out[1].OK || out[0].Remaining != 3 || out[1].Remaining != 3 {
		t.Errorf("decisions %+v, want both granted with 3 left", out)
	}
	want := map[string]int{
		fmt.Sprint(modePrepare, " ", ka): 2, fmt.Sprint(modeCommit, " ", ka): 1,
		fmt.Sprint(modePrepare, " ", kb): 1, fmt.Sprint(modeCommit, " ", kb): 1,
	}
	if diff := cmp.Diff(want, h.seen); diff != "" {
		t.Errorf("scripts by mode and key (-want +got):\n%s", diff)
	}
}

// fcallHook is a go-redis hook that runs process (nil: the command alone)
// for every FCALL a client sends by itself, with its mode and first key,
// and before for every FCALL of a pipeline before the pipeline is sent.
type fcallHook struct {
	process func(ctx context.Context, cmd redis.Cmder, mode int64, key string, next redis.ProcessHook) error
	before  func(mode int64, key string)
	// drop: an FCALL of a pipeline that drop picks is not sent, and fails
	// with errInjected.
	drop func(mode int64, key string) bool
}

func (h *fcallHook) hook() *redistest.Hook {
	return &redistest.Hook{
		Process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
			if m, k, ok := fcallMode(cmd); ok && h.process != nil {
				return h.process(ctx, cmd, m, k, next)
			}
			return next(ctx, cmd)
		},
		Pipeline: func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
			keep := cmds[:0:0]
			for _, cmd := range cmds {
				m, k, ok := fcallMode(cmd)
				if ok && h.before != nil {
					h.before(m, k)
				}
				if ok && h.drop != nil && h.drop(m, k) {
					cmd.SetErr(errInjected)
					continue
				}
				keep = append(keep, cmd)
			}
			if len(keep) == 0 {
				return errInjected
			}
			return next(ctx, keep)
		},
	}
}

var errInjected = errors.New("injected: the reply was lost")

// failAfter lets Redis run the FCALLs fail picks and then answers the
// caller an error: a reply lost after the script ran (a caller that gave
// up after sending it).
func failAfter(fail func(mode int64, key string) bool) *fcallHook {
	return &fcallHook{process: func(ctx context.Context, cmd redis.Cmder, m int64, k string, next redis.ProcessHook) error {
		err := next(ctx, cmd)
		if err == nil && fail(m, k) {
			cmd.SetErr(errInjected)
			return errInjected
		}
		return err
	}}
}

// TestClusterTwoStepReleasesFailedPrepare: a two-step call whose prepare
// ran in Redis but whose answer did not come back releases that slot's
// locks too, so that they do not block the key for the whole lease.
func TestClusterTwoStepReleasesFailedPrepare(t *testing.T) {
	c, other, s, a, b, ka, kb := twoSlots(t)
	c.AddHook(failAfter(func(mode int64, key string) bool { return mode == modePrepare && key == ka }).hook())
	out := make([]tiers.Decision, 2)
	if err := s.Decide(context.Background(), storetest.T0, []store.Item{a, b}, out); !errors.Is(err, errInjected) {
		t.Fatalf("Decide: %v, want the injected error", err)
	}
	// The release goes in the background: the store settles once it is done.
	settle(t, s)
	for _, k := range []string{ka, kb} {
		if other.Exists(context.Background(), lockKey(s.prefix, k)).Val() != 0 {
			t.Errorf("the lock of %s is still there (%v to live)", k, other.PTTL(context.Background(), lockKey(s.prefix, k)).Val())
		}
	}
	// Nothing was written: both keys still have their five hits.
	for _, it := range []store.Item{a, b} {
		if d := storetest.Decide(t, s, storetest.T0, it)[0]; !d.OK || d.Remaining != 4 {
			t.Errorf("%s after the failed call: %+v, want granted with 4 left", it.Key.Resource, d)
		}
	}
}

// twoSlots starts a 3-master Cluster and returns its client c, another
// client, a store on c with no dispatchers (each script is sent by the
// goroutine that makes it, through c's hooks) and no seal step however slow
// the machine, and two items of a one-tier limit of 5 whose keys ka and kb
// are in different slots.
// twoSlots: a store on a Cluster, another client, and two items a and b of
// keys ka and kb in two slots, whose calls take the two-step (a hard
// limit: not undoable).
func twoSlots(t *testing.T) (c, other *redis.ClusterClient, s *Store, a, b store.Item, ka, kb string) {
	t.Helper()
	return slotsOf(t, &tiers.Policy{Kind: tiers.KindTiers, HardLimit: 1000, Tiers: []tiers.Tier{{Limit: 5, Window: time.Hour, Active: tiers.Unbounded}}})
}

// slotsOf is twoSlots with items of policy p.
func slotsOf(t *testing.T, p *tiers.Policy) (c, other *redis.ClusterClient, s *Store, a, b store.Item, ka, kb string) {
	t.Helper()
	nodes, c := clusterClient(t)
	other = redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{nodes[0].Addr()}})
	t.Cleanup(func() { other.Close() })
	s = testStore(t, c, Options{Clock: ClockCaller, Pipelines: -1})
	s.sealAfter = time.Minute
	a, b = item(p, "ra", "a", 1), item(p, "rb", "b", 1)
	ka, _ = stateKey(s.prefix, &a)
	kb, _ = stateKey(s.prefix, &b)
	if slot(ka) == slot(kb) {
		t.Fatal("test keys share a slot")
	}
	return c, other, s, a, b, ka, kb
}

// tryAgainErr is Redis Cluster's TRYAGAIN reply, as go-redis returns it.
type tryAgainErr struct{}

func (tryAgainErr) Error() string { return "TRYAGAIN Multiple keys request during rehashing of slot" }
func (tryAgainErr) RedisError()   {}

// tryAgain answers TRYAGAIN, without running it, to each of the first n
// FCALLs that match (a slot being migrated); left counts down.
func tryAgain(n int32, match func(mode int64, key string) bool) (h *fcallHook, left *atomic.Int32) {
	left = new(atomic.Int32)
	left.Store(n)
	return &fcallHook{process: func(ctx context.Context, cmd redis.Cmder, m int64, k string, next redis.ProcessHook) error {
		if match(m, k) && left.Add(-1) >= 0 {
			cmd.SetErr(tryAgainErr{})
			return cmd.Err()
		}
		return next(ctx, cmd)
	}}, left
}

// TestClusterTryAgainUntilDeadline: a call whose slot keeps answering
// TRYAGAIN until its caller's deadline fails as a call whose keys stayed
// locked (ErrBusy, with the context's error): nothing ran, and Redis's
// TRYAGAIN never reaches the caller.
func TestClusterTryAgainUntilDeadline(t *testing.T) {
	c, _, s, a, _, ka, _ := twoSlots(t)
	h, left := tryAgain(1<<30, func(mode int64, key string) bool { return mode == modeChecked && key == ka })
	c.AddHook(h.hook())
	defer left.Store(0)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := s.Decide(ctx, storetest.T0, []store.Item{a}, make([]tiers.Decision, 1))
	if !errors.Is(err, ErrBusy) || !errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "TRYAGAIN") {
		t.Fatalf("Decide: %v, want ErrBusy and the deadline, no TRYAGAIN", err)
	}
}

// TestClusterTryAgainRetried: a call that meets TRYAGAIN (its slot is being
// migrated; the command did not run) is sent again within its caller's
// deadline, in each step: a one-slot call, a two-step's prepare and its
// commit. The answers and the stored hits are those of a call that met
// none.
func TestClusterTryAgainRetried(t *testing.T) {
	c, _, s, a, b, ka, kb := twoSlots(t)
	for _, tc := range []struct {
		name  string
		mode  int64
		key   string
		items []store.Item
	}{
		{"one slot", modeChecked, ka, []store.Item{a}},
		{"prepare", modePrepare, kb, []store.Item{a, b}},
		{"commit", modeCommit, ka, []store.Item{a, b}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, left := tryAgain(3, func(mode int64, key string) bool { return mode == tc.mode && key == tc.key })
			c.AddHook(h.hook())
			defer left.Store(0) // the hook stays; it matches no more
			out := make([]tiers.Decision, len(tc.items))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := s.Decide(ctx, storetest.T0, tc.items, out); err != nil {
				t.Fatalf("Decide: %v, want TRYAGAIN retried", err)
			}
			if left := left.Load(); left > 0 {
				t.Fatalf("the hook answered TRYAGAIN %d times, want 3", 3-left)
			}
			for i, d := range out {
				if !d.OK || d.Granted != 1 {
					t.Errorf("item %d: %+v, want 1 hit granted", i, d)
				}
			}
		})
	}
	// a: 3 calls, b: 2, each granted once.
	for _, tc := range []struct {
		it   store.Item
		hits int64
	}{{a, 3}, {b, 2}} {
		v, err := s.Inspect(context.Background(), storetest.T0, &tc.it)
		if err != nil {
			t.Fatal(err)
		}
		if h := v.Tiers[0].Hits; h != tc.hits {
			t.Errorf("%s holds %d hits, want %d", tc.it.Key.Domain, h, tc.hits)
		}
	}
}

// replayOnce runs the first matching FCALL twice, answering with the
// second reply: go-redis retrying a command whose reply was lost.
func replayOnce(match func(mode int64, key string) bool) *fcallHook {
	var done atomic.Bool
	return &fcallHook{process: func(ctx context.Context, cmd redis.Cmder, m int64, k string, next redis.ProcessHook) error {
		if match(m, k) && done.CompareAndSwap(false, true) {
			_ = next(ctx, cmd) // ran; its reply is lost
		}
		return next(ctx, cmd)
	}}
}

// TestClusterReplayedPrepare: a prepare that runs twice (its first reply
// lost, the command sent again) finds its own lock, which is not another
// call's: the call commits, and leaves no lock behind.
func TestClusterReplayedPrepare(t *testing.T) {
	c, other, s, a, b, ka, _ := twoSlots(t)
	c.AddHook(replayOnce(func(mode int64, key string) bool { return mode == modePrepare && key == ka }).hook())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := make([]tiers.Decision, 2)
	if err := s.Decide(ctx, storetest.T0, []store.Item{a, b}, out); err != nil {
		t.Fatalf("a call whose prepare ran twice: %v, want it decided", err)
	}
	for i, d := range out {
		if !d.OK || d.Granted != 1 {
			t.Errorf("item %d: %+v, want 1 hit granted", i, d)
		}
	}
	if n := other.Exists(context.Background(), lockKey(s.prefix, ka)).Val(); n != 0 {
		t.Errorf("the lock of a is left behind")
	}
}

// TestClusterTwoStepFailureDoesNotWaitForRelease: a two-step call whose
// prepare failed (a master that stopped answering, here a reply lost)
// returns its error without waiting for the release of what its prepares
// locked, which goes in the background: the caller's deadline, not the
// release's lateReplyWait (a second on a stalled master), bounds it. The
// release of a's locks is held until the call has returned; then both
// slots' locks go.
func TestClusterTwoStepFailureDoesNotWaitForRelease(t *testing.T) {
	c, other, s, a, b, ka, kb := twoSlots(t)
	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	hold := func(m int64, k string) {
		if m == modeRelease && k == ka {
			once.Do(func() { close(held) })
			<-release
		}
	}
	c.AddHook((&fcallHook{
		process: func(ctx context.Context, cmd redis.Cmder, m int64, k string, next redis.ProcessHook) error {
			hold(m, k)
			err := next(ctx, cmd)
			if err == nil && m == modePrepare && k == ka {
				cmd.SetErr(errInjected)
				return errInjected
			}
			return err
		},
		before: hold,
	}).hook())
	var releaseOnce sync.Once
	unhold := func() { releaseOnce.Do(func() { close(release) }) }
	defer unhold()
	done := make(chan error, 1)
	go func() {
		done <- s.Decide(context.Background(), storetest.T0, []store.Item{a, b}, make([]tiers.Decision, 2))
	}()
	select {
	case err := <-done:
		if !errors.Is(err, errInjected) {
			t.Fatalf("Decide: %v, want the injected error", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Decide did not return while the release of a's locks was held: it waits for it")
	}
	select {
	case <-held:
	case <-time.After(20 * time.Second):
		t.Fatal("a's locks were never released")
	}
	unsettled(t, s, "the release of a's locks is held")
	unhold()
	settle(t, s)
	for _, k := range []string{ka, kb} {
		if other.Exists(context.Background(), lockKey(s.prefix, k)).Val() != 0 {
			t.Errorf("the lock of %s is still there", k)
		}
	}
}

// settle waits, with a generous deadline, until s has nothing pending.
func settle(t *testing.T, s *Store) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Settle(ctx); err != nil {
		t.Fatalf("Settle: %v", err)
	}
}
