package resilient_test

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/internal/store/resilient"
	"github.com/charonlimit/charon/tiers"
)

// memRemote is a memstore standing in for the Redis store: it decides, and
// its Ping always answers.
type memRemote struct{ *memstore.Store }

func (memRemote) Ping(context.Context) error { return nil }

// Example shows the wiring a server does: the --failure-mode flag, the
// breaker driving health, Flush on reload, and Stats for metrics. A memstore
// stands in for the Redis store.
func Example() {
	var mode resilient.Mode // zero value: local
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.Var(&mode, "failure-mode", "local|open|closed|unavailable")
	fs.Parse([]string{"--failure-mode=unavailable"})

	var s *resilient.Store
	s = resilient.New(memRemote{memstore.New(memstore.Options{})}, resilient.Options{
		Mode: mode,
		OnBreakerChange: func(b resilient.BreakerState) {
			// health.SetServingStatus("", SERVING or NOT_SERVING from s.Serving())
			fmt.Println("breaker", b)
		},
	})
	defer s.Close()

	p := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 1, Window: time.Minute, Active: tiers.Unbounded}}}
	items := []store.Item{{Key: store.Key{Resource: "api", Domain: "alice", PolicyID: 1}, Policy: p, Hits: 1, Min: 1}}
	out := make([]tiers.Decision, 1)
	for range 3 {
		s.Decide(context.Background(), time.Unix(0, 0), items, out)
	}
	s.Flush() // on every configuration reload

	st := s.Stats()
	fmt.Println("serving", s.Serving(), "remote", st.Remote, "cached", st.Cached, "cache size", st.CacheSize)
	// Output:
	// serving true remote 2 cached 1 cache size 0
}
