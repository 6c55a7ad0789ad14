package redisbackend

import (
	"testing"
	"time"

	"github.com/charonlimit/charon/internal/escrow"
	"github.com/charonlimit/charon/internal/escrow/pooltest"
	"github.com/charonlimit/charon/internal/redistest"
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
