package sharestore_test

import (
	"context"
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

// TestMemorySweep: a budget nobody allocates any more is forgotten once its
// leases expire, and not before.
func TestMemorySweep(t *testing.T) {
	m := &sharestore.Memory{}
	t0 := time.Unix(1_700_000_000, 0)
	if _, err := m.Allocate(context.Background(), t0, sharestore.Budget{Key: "k", Limit: 5}, []sharestore.Demand{{ID: "a", Demand: 1}}, 3*time.Second, 0); err != nil {
		t.Fatal(err)
	}
	m.Sweep(t0.Add(2 * time.Second))
	if m.Len() != 1 {
		t.Fatalf("budgets after a sweep within the lease: %d, want 1", m.Len())
	}
	m.Sweep(t0.Add(3 * time.Second))
	if m.Len() != 0 {
		t.Fatalf("budgets after the lease: %d, want 0", m.Len())
	}
}

func TestMemoryRenew(t *testing.T) {
	sharestoretest.RunRenewer(t, func(t *testing.T) (sharestore.Store, sharestoretest.Clock) {
		return &sharestore.Memory{}, &sharestoretest.FakeClock{T: time.Unix(1_700_000_000, 0)}
	})
}
