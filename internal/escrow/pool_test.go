package escrow_test

import (
	"testing"
	"time"

	"github.com/charonlimit/charon/internal/escrow"
	"github.com/charonlimit/charon/internal/escrow/pooltest"
)

func TestMemPool(t *testing.T) {
	pooltest.Run(t, func(t *testing.T) (escrow.Pool, func(time.Duration)) {
		now := time.Unix(1_700_000_000, 0)
		return escrow.NewMemPool(func() time.Time { return now }), func(d time.Duration) { now = now.Add(d) }
	})
}
