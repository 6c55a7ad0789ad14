package redisstore

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/charonlimit/charon/internal/redistest"
	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/storetest"
)

var prefixes atomic.Int64

// newPrefix returns a key prefix no other store of the test binary uses, so
// that stores sharing one Redis start empty.
func newPrefix() string { return fmt.Sprintf("t%d:", prefixes.Add(1)) }

// singleClient starts a redis-server and returns a client of it.
func singleClient(t *testing.T) (*redistest.Node, *redis.Client) {
	t.Helper()
	n := redistest.Single(t)
	return n, redistest.Client(t, n)
}

// clusterClient starts a Cluster of 3 masters and returns a client of it.
func clusterClient(t *testing.T) ([]*redistest.Node, *redis.ClusterClient) {
	t.Helper()
	nodes := redistest.Cluster(t, 3)
	return nodes, redistest.ClusterClient(t, nodes)
}

func testStore(t testing.TB, c redis.UniversalClient, opts Options) *Store {
	t.Helper()
	if opts.KeyPrefix == "" {
		opts.KeyPrefix = newPrefix()
	}
	s, err := NewWithClient(c, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformanceSingle(t *testing.T) {
	_, c := singleClient(t)
	storetest.Run(t, func(t *testing.T) store.Store { return testStore(t, c, Options{Clock: ClockCaller}) })
}

func TestConformanceCluster(t *testing.T) {
	_, c := clusterClient(t)
	storetest.Run(t, func(t *testing.T) store.Store { return testStore(t, c, Options{Clock: ClockCaller}) })
}

var _ = context.Background
