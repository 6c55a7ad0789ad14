package redisbackend

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/charonlimit/charon/internal/redisconn"
	"github.com/charonlimit/charon/internal/redistest"
	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/resilient"
	"github.com/charonlimit/charon/tiers"
)

// masterOf maps a domain of resource "r" (policy 1, no global limit: the
// hash tag {r/domain}, docs/redis.md's key layout) to the port of the
// master serving its slot, asking Redis itself (CLUSTER KEYSLOT, CLUSTER
// SLOTS), not the store.
func masterOf(t *testing.T, c *redis.Client, domains []string) map[string]int {
	t.Helper()
	ctx := context.Background()
	ranges, err := c.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, d := range domains {
		sl, err := c.ClusterKeySlot(ctx, "{r/"+d+"}").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range ranges {
			if int64(r.Start) <= sl && sl <= int64(r.End) {
				p := r.Nodes[0].Addr[strings.LastIndexByte(r.Nodes[0].Addr, ':')+1:]
				out[d], _ = strconv.Atoi(p)
			}
		}
	}
	return out
}

// TestClusterMasterKilled kills one master of three under load (the
// Cluster told to serve the slots it still covers, as a Cluster whose
// dead master has no replica must be for any slot to be served): every
// call whose keys live on the other masters is still decided by Redis
// (the unavailable mode answers an error for any call Redis did not
// decide), the dead master's breaker alone opens, and every call on its
// slots is answered, by the failure mode, before its deadline. After the
// master comes back its breaker closes and Redis decides its slots again.
func TestClusterMasterKilled(t *testing.T) {
	nodes := redistest.Cluster(t, 3)
	for _, n := range nodes {
		if err := redistest.Client(t, n).ConfigSet(context.Background(), "cluster-require-full-coverage", "no").Err(); err != nil {
			t.Fatal(err)
		}
	}
	b, err := Open(Options{Conn: redisconn.Options{URL: "redis-cluster://" + nodes[0].Addr()}, FailureMode: resilient.ModeUnavailable, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	stop := b.Run(context.Background(), nil)
	defer stop()

	domains := make([]string, 300)
	for i := range domains {
		domains[i] = "d" + strconv.Itoa(i)
	}
	of := masterOf(t, redistest.Client(t, nodes[0]), domains)
	dead := nodes[1]
	p := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 1_000_000, Window: time.Minute, Active: tiers.Unbounded}}}
	decide := func(domain string, deadline time.Duration) (late bool, err error) {
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		items := []store.Item{{Key: store.Key{Resource: "r", Domain: domain, PolicyID: 1}, Policy: p, Hits: 1, Min: 1}}
		out := make([]tiers.Decision, 1)
		err = b.Store().Decide(ctx, time.Now(), items, out)
		if err == nil && !out[0].OK {
			err = fmt.Errorf("refused: %+v", out[0])
		}
		return ctx.Err() != nil, err
	}
	for _, d := range domains { // warm every master's pool
		if _, err := decide(d, 10*time.Second); err != nil {
			t.Fatalf("warm %s: %v", d, err)
		}
	}

	dead.Kill()
	var (
		liveCalls, liveFailed, deadCalls, deadAnswered, deadLate, deadRemote atomic.Int64
		firstLive                                                            atomic.Value
		wg                                                                   sync.WaitGroup
		mu                                                                   sync.Mutex
		deadTimes                                                            []time.Duration
	)
	for w := range 8 {
		wg.Go(func() {
			for i := range 150 {
				d := domains[(w*151+i*7)%len(domains)]
				if of[d] != dead.Port {
					// A live master's: Redis decides, whatever the load
					// (a deadline no busy machine reaches).
					liveCalls.Add(1)
					if _, err := decide(d, 10*time.Second); err != nil {
						liveFailed.Add(1)
						firstLive.CompareAndSwap(nil, err.Error())
					}
					continue
				}
				deadCalls.Add(1)
				start := time.Now()
				late, err := decide(d, 2*time.Second)
				took := time.Since(start)
				mu.Lock()
				deadTimes = append(deadTimes, took)
				mu.Unlock()
				switch {
				case late:
					deadLate.Add(1)
				case errors.Is(err, resilient.ErrUnavailable):
					deadAnswered.Add(1)
				case err == nil:
					deadRemote.Add(1) // impossible with the master dead
				}
			}
		})
	}
	wg.Wait()
	sort.Slice(deadTimes, func(i, j int) bool { return deadTimes[i] < deadTimes[j] })
	st := b.Store().Stats()
	t.Logf("reliability: one of 3 Cluster masters killed under load: %d calls on the live masters' slots, %d failed; %d on the dead master's, %d answered by the failure mode (p50 %v, max %v), %d late; breakers %+v",
		liveCalls.Load(), liveFailed.Load(), deadCalls.Load(), deadAnswered.Load(), deadTimes[len(deadTimes)/2], deadTimes[len(deadTimes)-1], deadLate.Load(), st.Shards)
	if liveFailed.Load() != 0 {
		t.Errorf("%d of %d calls on the live masters were not decided by Redis; first: %v", liveFailed.Load(), liveCalls.Load(), firstLive.Load())
	}
	if deadLate.Load() != 0 || deadAnswered.Load() != deadCalls.Load() {
		t.Errorf("of %d calls on the dead master's slots, %d answered by the failure mode, %d past their deadline, %d decided by Redis",
			deadCalls.Load(), deadAnswered.Load(), deadLate.Load(), deadRemote.Load())
	}
	open := map[string]resilient.BreakerState{}
	for _, sh := range st.Shards {
		open[sh.Name] = sh.Breaker
	}
	for _, n := range nodes {
		want := resilient.BreakerClosed
		if n == dead {
			want = resilient.BreakerOpen
		}
		if got, ok := open[n.Addr()]; !ok || got != want {
			t.Errorf("master %s: breaker %v (known %v), want %v; all: %+v", n.Addr(), got, ok, want, st.Shards)
		}
	}
	if !b.Store().Serving() {
		t.Error("not serving with two masters of three up")
	}

	// The master comes back (empty: its function loaded again by the
	// probe): its breaker closes and Redis decides its slots.
	dead.Restart(t)
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		d := domains[slices.IndexFunc(domains, func(d string) bool { return of[d] == dead.Port })]
		if _, err := decide(d, 2*time.Second); err == nil {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the restarted master's slots still not decided by Redis after 30 s: %+v", b.Store().Stats().Shards)
		}
	}
}
