package redisbackend

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/charonlimit/charon/internal/redisconn"
	"github.com/charonlimit/charon/internal/redistest"
	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/resilient"
	"github.com/charonlimit/charon/tiers"
)

// openReplica opens a backend on the Redis at addr beating every 50 ms,
// whose processes drop out 2 s after their last beat, and runs it; the
// returned function stops it (leaving the count). Both close at t's end.
func openReplica(t *testing.T, addr string) (*Backend, *prometheus.Registry, func()) {
	t.Helper()
	b, err := Open(Options{Conn: redisconn.Options{URL: "redis://" + addr}, Timeout: 5 * time.Second,
		PresenceInterval: 50 * time.Millisecond, PresenceTTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	reg := prometheus.NewRegistry()
	b.Register(reg)
	stop := b.Run(context.Background(), nil)
	t.Cleanup(stop)
	return b, reg, stop
}

// waitReplicas waits until every backend counts want replicas.
func waitReplicas(t *testing.T, want int64, bs ...*Backend) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ok := true
		for _, b := range bs {
			ok = ok && b.Store().Stats().Replicas == want
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			for i, b := range bs {
				t.Logf("backend %d counts %d", i, b.Store().Stats().Replicas)
			}
			t.Fatalf("the backends do not all count %d replicas within 60 s", want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPresenceCounts: three processes on one Redis count three; one that
// stops cleanly leaves the count at once, one that dies drops out after
// the TTL.
func TestPresenceCounts(t *testing.T) {
	n := redistest.Single(t)
	a, _, _ := openReplica(t, n.Addr())
	b, _, _ := openReplica(t, n.Addr())
	c, _, stopC := openReplica(t, n.Addr())
	waitReplicas(t, 3, a, b, c)
	stopC()
	waitReplicas(t, 2, a, b)

	// A process that beat once and died: counted, then dropped after the
	// TTL (2 s here) with no leave.
	ghost := newPresence(a.client, 2*time.Second)
	ghost.id = "ghost"
	if n, err := ghost.beat(context.Background()); err != nil || n != 3 {
		t.Fatalf("the ghost's beat: %d, %v; want 3 counted", n, err)
	}
	waitReplicas(t, 3, a, b)
	waitReplicas(t, 2, a, b)
}

// TestLocalModeSharesAfterRedisStops: three processes on one Redis count
// each other; Redis is then stopped, and each process's local failure
// mode grants floor(10/3) = 3 of a limit of 10 (9 in all, within the
// limit; without the count each would grant 10, 30 in all), with
// charon_store_replicas 3 on each. The count stays the one seen before
// the outage.
func TestLocalModeSharesAfterRedisStops(t *testing.T) {
	n := redistest.Single(t)
	var bs []*Backend
	var regs []*prometheus.Registry
	for range 3 {
		b, reg, _ := openReplica(t, n.Addr())
		bs, regs = append(bs, b), append(regs, reg)
	}
	waitReplicas(t, 3, bs...)
	n.Kill()

	const limit = 10
	p := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: limit, Window: time.Hour, Active: tiers.Unbounded}}}
	items := []store.Item{{Key: store.Key{Resource: "r", Domain: "during-outage", PolicyID: p.Shape()}, Policy: p, Hits: 1, Min: 1}}
	out := make([]tiers.Decision, 1)
	total := 0
	for i, b := range bs {
		granted := 0
		for range 3 * limit {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := b.Store().Decide(ctx, time.Now(), items, out)
			cancel()
			if err != nil {
				t.Fatalf("replica %d: %v", i, err)
			}
			if out[0].OK {
				granted++
			}
		}
		st := b.Store().Stats()
		if st.Remote != 0 || st.Local != 3*limit {
			t.Errorf("replica %d: %d remote and %d local decisions, want every one of %d local", i, st.Remote, st.Local, 3*limit)
		}
		if want := int(resilient.ShareOf(limit, 3)); granted != want {
			t.Errorf("replica %d granted %d of a limit of %d with Redis stopped, want its share %d", i, granted, limit, want)
		}
		if got, ok := gathered(t, regs[i], "charon_store_replicas"); !ok || got != 3 {
			t.Errorf("replica %d: charon_store_replicas %v (exported: %v), want 3", i, got, ok)
		}
		total += granted
	}
	if total > limit {
		t.Errorf("the three replicas granted %d in all, over the limit of %d", total, limit)
	}
	// The beats (every 50 ms) failed while the decisions ran: the count is
	// kept.
	for i, b := range bs {
		if got := b.Store().Stats().Replicas; got != 3 {
			t.Errorf("replica %d counts %d with Redis stopped, want the 3 seen before", i, got)
		}
	}
	t.Logf("with Redis stopped, three replicas granted %d of a limit of %d", total, limit)
}
