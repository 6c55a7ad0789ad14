package redisstore

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/charonlimit/charon/internal/store"
)

// Ping checks that Redis answers without deciding anything (PING; on a
// Cluster, PING to every master known to the client). It implements the
// Pinger of package resilient, whose Probe uses it to close the circuit
// breaker of an idle server. It returns store.ErrClosed after Close.
func (s *Store) Ping(ctx context.Context) error {
	if s.closed.Load() {
		return store.ErrClosed
	}
	var err error
	if cc, ok := s.c.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			return c.Ping(ctx).Err()
		})
	} else {
		err = s.c.Ping(ctx).Err()
	}
	if err != nil {
		return fmt.Errorf("redisstore: ping: %w", err)
	}
	return nil
}
