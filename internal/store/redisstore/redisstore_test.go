package redisstore

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/charonlimit/charon/internal/redisconn"
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

// openStore opens a client of conn (package redisconn: as a process does)
// and a store over it, both closed when the test ends.
func openStore(t testing.TB, conn redisconn.Options, opts Options) *Store {
	t.Helper()
	c, err := redisconn.Open(conn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return testStore(t, c, opts)
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

// TestKeyPrefixBrace: a key prefix holding a brace would move keys out of
// their hash slot; the store refuses it.
func TestKeyPrefixBrace(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	if s, err := NewWithClient(c, Options{KeyPrefix: "a{b"}); err == nil {
		s.Close()
		t.Error("a key prefix with a brace was accepted")
	}
}
