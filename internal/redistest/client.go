package redistest

import (
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
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

// VerifyTestMain runs a package's tests and fails them if a goroutine
// outlives them (goleak), but for go-redis' redial loop: a client whose
// server was killed redials it once a second, and the loop ends at the try
// after the client is closed, up to a second after the tests.
func VerifyTestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}
