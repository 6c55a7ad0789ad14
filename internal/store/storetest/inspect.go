package storetest

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/tiers"
)

// testInspect replays a random trace on the store and on the Model, and
// checks at every step that the store's view of each pair is the Model's
// (the state the next requests will meet), that inspecting changes nothing,
// and that a reset pair is decided as a fresh one while the others keep
// their state.
func testInspect(t *testing.T, s store.Store) {
	in, ok := s.(store.Inspector)
	if !ok {
		t.Skip("the store is not an Inspector")
	}
	ctx := context.Background()
	var m Model
	rng := rand.New(rand.NewPCG(7, 11))
	pols := []*tiers.Policy{penalty, hard, global, bucket, fixed, big}
	now := T0
	out, want := make([]tiers.Decision, 1), make([]tiers.Decision, 1)
	for step := range 400 {
		now = now.Add(time.Duration(rng.IntN(300)) * time.Millisecond)
		p := pols[rng.IntN(len(pols))]
		it := take(p, "r"+string(rune('0'+rng.IntN(len(pols)))), []string{"a", "b"}[rng.IntN(2)], int64(1+rng.IntN(4)))
		it.Policy = pols[it.Key.Resource[1]-'0']
		switch rng.IntN(10) {
		case 0:
			if err := in.Reset(ctx, &it); err != nil {
				t.Fatalf("step %d: Reset: %v", step, err)
			}
			m.Reset(ctx, &it)
		case 1, 2:
			got, err := in.Inspect(ctx, now, &it)
			if err != nil {
				t.Fatalf("step %d: Inspect: %v", step, err)
			}
			w, _ := m.Inspect(ctx, now, &it)
			if diff := cmp.Diff(w, got); diff != "" {
				t.Fatalf("step %d: view of %v (-model +store):\n%s", step, it.Key, diff)
			}
		default:
			it.Min = 1 + rng.Int64N(it.Hits)
			items := []store.Item{it}
			if err := s.Decide(ctx, now, items, out); err != nil {
				t.Fatalf("step %d: Decide: %v", step, err)
			}
			m.Decide(ctx, now, items, want)
			if diff := cmp.Diff(want[0], out[0]); diff != "" {
				t.Fatalf("step %d: decision after inspections and resets (-model +store):\n%s", step, diff)
			}
		}
	}
}
