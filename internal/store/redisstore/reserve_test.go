package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/tiers"
)

// TestReserveRedisClock: on Redis's clock a reservation decides at the
// master's instant plus after (the offset after the items, fdecide's
// "Pacing"), so a hit reserved past the window is granted, takes the slot
// of every later request, and is given back by a refund reserved for the
// same instant; a fixed window's next window is reserved alike. The
// windows are long (10s, a minute) so that the milliseconds between calls
// do not matter.
func TestReserveRedisClock(t *testing.T) {
	for _, name := range []string{"single", "cluster"} {
		t.Run(name, func(t *testing.T) {
			if name == "single" {
				_, c := singleClient(t)
				testReserve(t, testStore(t, c, Options{}))
			} else {
				_, c := clusterClient(t)
				testReserve(t, testStore(t, c, Options{}))
			}
		})
	}
}

func testReserve(t *testing.T, s *Store) {
	ctx := context.Background()
	sliding := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 1, Window: 10 * time.Second, Active: tiers.Unbounded}}}
	fixed := &tiers.Policy{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Limit: 1, Unit: tiers.UnitMinute}}
	for _, p := range []*tiers.Policy{sliding, fixed} {
		t.Run(p.Kind.String(), func(t *testing.T) {
			it := []store.Item{{Key: store.Key{Resource: "r", Domain: "d" + p.Kind.String(), PolicyID: 1}, Policy: p, Hits: 1, Min: 1}}
			out := make([]tiers.Decision, 1)
			now := time.Now() // ignored on Redis's clock
			var reserved time.Time
			decide := func(what string, after time.Duration, items []store.Item, want bool) tiers.Decision {
				t.Helper()
				var err error
				if after < 0 {
					err = s.Decide(ctx, now, items, out)
				} else {
					reserved, err = s.Reserve(ctx, now, after, items, out)
				}
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				if out[0].OK != want {
					t.Fatalf("%s: got OK %v, want %v (%+v)", what, out[0].OK, want, out[0])
				}
				return out[0]
			}
			decide("first", -1, it, true)
			d := decide("second", -1, it, false)
			if p == sliding {
				// Reserving 4s later: the wait is 4s shorter.
				r := decide("reserve at +4s", 4*time.Second, it, false)
				if got := d.RetryAfter - r.RetryAfter; got < 3900*time.Millisecond || got > 4100*time.Millisecond {
					t.Fatalf("retry after %v now, %v at +4s: want 4s less", d.RetryAfter, r.RetryAfter)
				}
			}
			at := d.RetryAfter + 100*time.Millisecond
			decide("reserve past the window", at, it, true)
			decide("now, behind the reservation", -1, it, false)
			first := reserved
			decide("the same wait again", at, it, false)
			if err := s.GiveBack(ctx, now, first, it); err != nil {
				t.Fatalf("give back: %v", err)
			}
			decide("reserve again, once given back", at, it, true)
			if !reserved.After(first) {
				t.Fatalf("reserved for %v, then %v: Redis's clock went back", first, reserved)
			}
		})
	}
}
