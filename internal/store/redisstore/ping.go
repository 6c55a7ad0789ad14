package redisstore

import (
	"context"
	"fmt"

	"github.com/charonlimit/charon/internal/store"
)

// Ping checks that Redis answers and is ready to decide, without deciding
// anything: PING, then FUNCTION LIST for this version's library, loading
// it where it is missing (on a Cluster, on every master known to the
// client). It is the probe of package resilient (a resilient.Remote): a
// Redis that restarted empty gets its function back under the probe's
// deadline, so the first decisions after recovery are one FCALL each. It
// returns store.ErrClosed after Close.
func (s *Store) Ping(ctx context.Context) error {
	if s.closed.Load() {
		return store.ErrClosed
	}
	if err := lib.Ready(ctx, s.c); err != nil {
		return fmt.Errorf("redisstore: ping: %w", err)
	}
	return nil
}
