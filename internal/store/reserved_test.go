package store_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/tiers"
)

// TestReserved: what a reservation gives back is each granted item's
// grant (Min 0), nothing of an item granted nothing or a rejected shadow
// item; nothing at all when a non-shadow item was rejected (nothing was
// committed).
func TestReserved(t *testing.T) {
	p := &tiers.Policy{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Limit: 10, Unit: tiers.UnitSecond}}
	it := func(dom string, hits int64, shadow bool) store.Item {
		return store.Item{Key: store.Key{Resource: "r", Domain: dom, PolicyID: 1}, Policy: p, Hits: hits, Min: hits, Shadow: shadow}
	}
	items := []store.Item{it("a", 3, false), it("b", 2, false), it("c", 4, true), it("d", 5, true)}
	ok := func(g int64) tiers.Decision { return tiers.Decision{OK: true, Granted: g} }
	got := store.Reserved(items, []tiers.Decision{ok(3), ok(0), {}, ok(5)})
	a, d := items[0], items[3]
	a.Min, d.Min = 0, 0
	if diff := cmp.Diff([]store.Item{a, d}, got); diff != "" {
		t.Errorf("given back (-want +got):\n%s", diff)
	}
	if got := store.Reserved(items, []tiers.Decision{ok(3), {}, ok(4), ok(5)}); got != nil {
		t.Errorf("a rejected reservation gives back %v, want nothing", got)
	}
}
