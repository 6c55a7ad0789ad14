package redisstore

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/charonlimit/charon/internal/store"
)

// Ping checks that Redis answers and is ready to decide, without deciding
// anything: PING, then FUNCTION LIST for this version's library, loading
// it where it is missing (on a Cluster, on every master known to the
// client). It implements the Pinger of package resilient, whose Probe uses
// it as the breaker's half-open probe: a Redis that restarted empty gets
// its function back under the probe's deadline, so the first decisions
// after recovery are one FCALL each. It returns store.ErrClosed after
// Close.
func (s *Store) Ping(ctx context.Context) error {
	if s.closed.Load() {
		return store.ErrClosed
	}
	var err error
	if cc, ok := s.c.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return ready(ctx, m) })
	} else {
		err = ready(ctx, s.c)
	}
	if err != nil {
		return fmt.Errorf("redisstore: ping: %w", err)
	}
	return nil
}

// ready pings one node and loads the decide library there when it lacks it.
func ready(ctx context.Context, c redis.Cmdable) error {
	if err := c.Ping(ctx).Err(); err != nil {
		return err
	}
	libs, err := c.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: libName}).Result()
	if err != nil {
		return err
	}
	if len(libs) > 0 {
		return nil
	}
	return c.FunctionLoadReplace(ctx, libraryCode).Err()
}
