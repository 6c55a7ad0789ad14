package redistest

import (
	"testing"

	"github.com/redis/go-redis/v9"
)

// Client returns a client of n, closed when the test ends.
func Client(t testing.TB, n *Node) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: n.Addr()})
	t.Cleanup(func() { c.Close() })
	return c
}

// ClusterClient returns a Cluster client seeded with every node of nodes,
// closed when the test ends.
func ClusterClient(t testing.TB, nodes []*Node) *redis.ClusterClient {
	t.Helper()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: Addrs(nodes)})
	t.Cleanup(func() { c.Close() })
	return c
}
