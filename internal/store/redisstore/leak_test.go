package redisstore

import (
	"testing"

	"github.com/charonlimit/charon/internal/redistest"
)

// TestMain fails the package's tests if any goroutine outlives them.
func TestMain(m *testing.M) {
	redistest.VerifyTestMain(m)
}
