package redisshare

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/charonlimit/charon/internal/redistest"
	"github.com/charonlimit/charon/internal/sharestore"
	"github.com/charonlimit/charon/internal/sharestore/sharestoretest"
)

func TestMain(m *testing.M) { redistest.VerifyTestMain(m) }

// realClock is Redis' clock: Advance waits (the suite polls with a deadline).
type realClock struct{}

func (realClock) Now() time.Time          { return time.Now() }
func (realClock) Advance(d time.Duration) { time.Sleep(d) }

func TestSingle(t *testing.T) {
	n := redistest.Single(t)
	sharestoretest.Run(t, func(t *testing.T) (a, b sharestore.Store, clk sharestoretest.Clock) {
		return New(redistest.Client(t, n)), New(redistest.Client(t, n)), realClock{}
	})
}

func TestCluster(t *testing.T) {
	nodes := redistest.Cluster(t, 3)
	sharestoretest.Run(t, func(t *testing.T) (a, b sharestore.Store, clk sharestoretest.Clock) {
		return New(redistest.ClusterClient(t, nodes)), New(redistest.ClusterClient(t, nodes)), realClock{}
	})
}

// TestConcurrentReplicas runs two stores on separate clients at once, each
// serving its own instances of one budget, and checks after every call, on
// Redis' own records, that the unexpired shares never sum above the limit.
func TestConcurrentReplicas(t *testing.T) {
	n := redistest.Single(t)
	ctx := context.Background()
	bud := sharestore.Budget{Key: "r:7:d", Limit: 100}
	check := redistest.Client(t, n)
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for r := range 2 {
		s := New(redistest.Client(t, n))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				// Instances come and go: each round serves a different
				// subset, so lost leases are always pending.
				var mine []sharestore.Demand
				for k := range 4 {
					if (i+k)%3 != 0 {
						mine = append(mine, sharestore.Demand{ID: fmt.Sprintf("r%d-%d", r, (i/5+k)%7), Demand: int64(10 + 40*k)})
					}
				}
				if _, err := s.Allocate(ctx, time.Time{}, bud, mine, 300*time.Millisecond, 0.1); err != nil {
					errs <- err
					return
				}
				if held, err := liveHeld(ctx, check, bud.Key); err != nil || held > bud.Limit {
					errs <- fmt.Errorf("round %d: unexpired shares sum to %d > %d (%v)", i, held, bud.Limit, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func liveHeld(ctx context.Context, c *redis.Client, budget string) (int64, error) {
	now, err := c.Time(ctx).Result()
	if err != nil {
		return 0, err
	}
	fields, err := c.HGetAll(ctx, Key(budget)).Result()
	if err != nil {
		return 0, err
	}
	var s int64
	for id, v := range fields {
		if c, ok := decode(id, v); ok && now.Before(c.Expires) {
			s += c.Held
		}
	}
	return s, nil
}

// TestUnavailable: a stopped Redis is an error wrapping ErrUnavailable.
func TestUnavailable(t *testing.T) {
	n := redistest.Single(t)
	s := New(redistest.Client(t, n))
	n.Kill()
	_, err := s.Allocate(context.Background(), time.Time{}, sharestore.Budget{Key: "k", Limit: 1}, []sharestore.Demand{{ID: "a", Demand: 1}}, time.Second, 0)
	if !errors.Is(err, sharestore.ErrUnavailable) {
		t.Fatalf("got %v, want ErrUnavailable", err)
	}
}
