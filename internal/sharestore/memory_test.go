package sharestore_test

import (
	"testing"
	"time"

	"github.com/charonlimit/charon/internal/sharestore"
	"github.com/charonlimit/charon/internal/sharestore/sharestoretest"
)

func TestMemory(t *testing.T) {
	sharestoretest.Run(t, func(t *testing.T) (a, b sharestore.Store, clk sharestoretest.Clock) {
		m := &sharestore.Memory{}
		return m, m, &sharestoretest.FakeClock{T: time.Unix(1_700_000_000, 0)}
	})
}
