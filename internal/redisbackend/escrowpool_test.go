package redisbackend

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/charonlimit/charon/internal/escrow"
	"github.com/charonlimit/charon/internal/escrow/pooltest"
	"github.com/charonlimit/charon/internal/redistest"
	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/tiers"
)

// TestEscrowPool runs the pool's contract on one Redis and on a Cluster of
// three (a pair's hash and lock share a slot). Redis keeps the pool on its
// own clock: a wait is a real one.
func TestEscrowPool(t *testing.T) {
	wait := func(d time.Duration) { time.Sleep(d) }
	t.Run("single", func(t *testing.T) {
		n := redistest.Single(t)
		c := redistest.Client(t, n)
		pooltest.Run(t, func(t *testing.T) (escrow.Pool, func(time.Duration)) {
			if err := c.FlushAll(t.Context()).Err(); err != nil {
				t.Fatal(err)
			}
			return &escrowPool{client: c}, wait
		})
	})
	t.Run("cluster", func(t *testing.T) {
		nodes := redistest.Cluster(t, 3)
		c := redistest.ClusterClient(t, nodes)
		pooltest.Run(t, func(t *testing.T) (escrow.Pool, func(time.Duration)) {
			return &escrowPool{client: c}, wait
		})
	})
}

// TestEscrowRegionsOnRedis runs two regions of two replicas on the real
// clock, region A's pool on a Cluster of three and region B's on one
// Redis, leasing from one home (the memory store), every replica asking
// as fast as it can for a key far over its limit and a key far under it,
// for three seconds. No window of the first holds more answered hits than
// its limit, whichever region answered; once every store and region has
// closed, the home counts exactly the hits answered of the second (every
// slice and lease gave back what it did not grant); and leases were taken
// from the pools.
func TestEscrowRegionsOnRedis(t *testing.T) {
	home := memstore.New(memstore.Options{MaxKeys: -1})
	t.Cleanup(func() { home.Close() })
	// Patient: a call that times out after Redis applied it leaves hits
	// taken and never granted, which is safe but which the exact count
	// below cannot tell from a lost give-back; on a busy machine a call
	// can outlast a lease. The test is of the protocol, not of timeouts.
	pools := []escrow.Pool{
		patientPool{&escrowPool{client: redistest.ClusterClient(t, redistest.Cluster(t, 3))}},
		patientPool{&escrowPool{client: redistest.Client(t, redistest.Single(t))}},
	}
	const limit, w = 200, 2 * time.Second
	burst := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: limit, Window: w, Active: tiers.Unbounded}}}
	big := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 1 << 40, Window: time.Minute, Active: tiers.Unbounded}}}
	items := []store.Item{
		{Key: store.Key{Resource: "burst_{x}", Domain: "d", PolicyID: 1}, Policy: burst, Hits: 1, Min: 1},
		{Key: store.Key{Resource: "big", Domain: "d", PolicyID: 2}, Policy: big, Hits: 1, Min: 1},
	}
	type replica struct {
		s *escrow.Store
		r *escrow.Region
	}
	var reps []replica
	for i := range 4 {
		r, err := escrow.NewRegion(escrow.RegionOptions{Home: home, Pool: pools[i%2], ID: fmt.Sprint("replica-", i), Run: true})
		if err != nil {
			t.Fatal(err)
		}
		s, err := escrow.New(escrow.Options{Remote: home, Leaser: r, Default: true, Threshold: 20, Size: escrow.SizeDemand, Run: true})
		if err != nil {
			t.Fatal(err)
		}
		reps = append(reps, replica{s, r})
	}
	var mu sync.Mutex
	var grants []time.Time // of burst
	var bigAnswered int64
	end := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	for _, rp := range reps {
		wg.Go(func() {
			out := make([]tiers.Decision, 1)
			for i := 0; time.Now().Before(end); i++ {
				it := items[i%2 : i%2+1]
				now := time.Now()
				if err := rp.s.Decide(context.Background(), now, it, out); err != nil {
					t.Error(err)
					return
				}
				if out[0].OK {
					mu.Lock()
					if i%2 == 0 {
						grants = append(grants, now)
					} else {
						bigAnswered++
					}
					mu.Unlock()
				}
				if i%64 == 0 {
					time.Sleep(time.Millisecond) // let the loops run on a busy machine
				}
			}
		})
	}
	wg.Wait()
	var takes uint64
	for _, rp := range reps {
		rp.s.Close()
		takes += rp.r.Stats().Takes
	}
	for _, rp := range reps {
		rp.r.Close()
	}
	if takes == 0 {
		t.Fatal("no lease was taken from the regions' pools")
	}
	// Above 64 hits a window is counted in 64 buckets: the limit holds
	// over the window less a bucket.
	eff := w - w/64 + time.Microsecond
	slices.SortFunc(grants, func(a, b time.Time) int { return a.Compare(b) })
	for i, j := 0, 0; i < len(grants); i++ {
		for j < len(grants) && grants[j].Sub(grants[i]) < eff {
			j++
		}
		if j-i > limit {
			t.Fatalf("%d grants of burst within %v from %v, limit %d", j-i, eff, grants[i], limit)
		}
	}
	out := make([]tiers.Decision, 1)
	check := items[1]
	check.Hits, check.Min = 0, 0
	if err := home.Decide(context.Background(), time.Now(), []store.Item{check}, out); err != nil {
		t.Fatal(err)
	}
	if out[0].TierHits != bigAnswered {
		t.Errorf("the home counts %d hits of big, %d were answered", out[0].TierHits, bigAnswered)
	}
	t.Logf("burst: %d granted in 3s (limit %d per %v); big: %d answered; %d leases from the pools", len(grants), limit, w, bigAnswered, takes)
}

// patientPool lets every call run to its answer: it drops the caller's
// deadline.
type patientPool struct{ p escrow.Pool }

func (p patientPool) Take(ctx context.Context, k string, want int64, need time.Duration) (int64, int64, escrow.PoolState, error) {
	return p.p.Take(context.WithoutCancel(ctx), k, want, need)
}

func (p patientPool) Put(ctx context.Context, k string, id, n int64) (bool, error) {
	return p.p.Put(context.WithoutCancel(ctx), k, id, n)
}

func (p patientPool) Add(ctx context.Context, k string, id, n int64, end time.Time) error {
	return p.p.Add(context.WithoutCancel(ctx), k, id, n, end)
}

func (p patientPool) Close(ctx context.Context, k string, id int64) (int64, error) {
	return p.p.Close(context.WithoutCancel(ctx), k, id)
}

func (p patientPool) Refuse(ctx context.Context, k string, d time.Duration, r escrow.Refusal) error {
	return p.p.Refuse(context.WithoutCancel(ctx), k, d, r)
}

func (p patientPool) Report(ctx context.Context, k, owner string, rate float64, ttl time.Duration) (float64, error) {
	return p.p.Report(context.WithoutCancel(ctx), k, owner, rate, ttl)
}

func (p patientPool) Lock(ctx context.Context, k, owner string, ttl time.Duration) (bool, error) {
	return p.p.Lock(context.WithoutCancel(ctx), k, owner, ttl)
}

func (p patientPool) Unlock(ctx context.Context, k, owner string) error {
	return p.p.Unlock(context.WithoutCancel(ctx), k, owner)
}
