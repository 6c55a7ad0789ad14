package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/internal/store/storetest"
	"github.com/charonlimit/charon/tiers"
)

// quotaZones have daylight-saving changes at midnight (Santiago), at 2:00
// (New York), of 30 minutes (Lord Howe), and half-hour offsets (Kolkata,
// St John's).
var quotaZones = []string{"UTC", "America/New_York", "America/Santiago", "Australia/Lord_Howe", "Pacific/Apia", "Asia/Kolkata", "America/St_Johns", "Europe/Berlin"}

// randQuota returns a random calendar quota: any period, a zone of
// quotaZones, and a third of them anchored, often on the 29th to 31st.
func randQuota(t testing.TB, r *rand.Rand, base time.Time) *tiers.Policy {
	loc, err := time.LoadLocation(quotaZones[r.IntN(len(quotaZones))])
	if err != nil {
		t.Fatal(err)
	}
	q := tiers.Quota{Limit: 1 + r.Int64N(6), Period: tiers.Period(1 + r.IntN(int(tiers.PeriodYear))), Location: loc}
	if r.IntN(3) == 0 {
		a := base.In(loc).AddDate(0, 0, -r.IntN(400))
		q.Anchor = time.Date(a.Year(), a.Month(), 28+r.IntN(4), r.IntN(24), r.IntN(60), r.IntN(60), 0, loc)
	}
	return &tiers.Policy{Kind: tiers.KindQuota, Quota: q, Overdraft: r.IntN(4) == 0}
}

// TestDifferentialQuota replays random traces of calendar quotas against
// the reference store (tiers and store.Apply), the memory store and the
// Redis store at the same now, beside a plain rate limit on the same
// descriptor (all or nothing over both), from 2031 to 2051 (after Redis's
// clock, which deletes keys whose expiry it has passed; leap days, DST
// changes in both directions as the zones' rules project them): the time
// jumps mostly to just
// before or just after a period boundary, so that every boundary the Go
// side computes is one the function must find in its table.
func TestDifferentialQuota(t *testing.T) {
	_, c := singleClient(t)
	traces, steps := 400, 40
	if testing.Short() {
		traces = 60
	}
	ctx := context.Background()
	rate := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 4, Window: time.Minute, Active: tiers.Unbounded}}}
	for seed := range uint64(traces) {
		r := rand.New(rand.NewPCG(seed, 28))
		base := time.Date(2031+r.IntN(20), time.Month(1+r.IntN(12)), 1+r.IntN(28), r.IntN(24), 0, 0, 0, time.UTC)
		quotas := []*tiers.Policy{randQuota(t, r, base), randQuota(t, r, base)}
		var m storetest.Model
		stores := []store.Store{&m, memstore.New(memstore.Options{}), testStore(t, c, Options{Clock: ClockCaller})}
		names := []string{"model", "memstore", "redis"}
		now := base
		for step := range steps {
			q := quotas[r.IntN(len(quotas))]
			switch r.IntN(6) {
			case 0: // same instant
			case 1:
				now = now.Add(randDur(r, time.Microsecond, 10*time.Second))
			case 2:
				now = now.Add(-randDur(r, time.Microsecond, 5*time.Millisecond))
			default:
				_, end := q.Quota.Bounds(now)
				now = end.Add(randDur(r, 0, 2*time.Second) - time.Second)
			}
			var items []store.Item
			for i := range 1 + r.IntN(3) {
				p := quotas[(i+step)%len(quotas)]
				key := store.Key{Resource: "r", Domain: fmt.Sprint("d", r.IntN(2)), PolicyID: uint64(i%len(quotas)) + 1}
				hits := int64(1 + r.IntN(3))
				if r.IntN(10) == 0 {
					items = append(items, store.Item{Key: key, Policy: p})
					continue
				}
				items = append(items, storetest.RandomItem(r, key, p, hits))
				if r.IntN(2) == 0 {
					items = append(items, store.Item{Key: store.Key{Resource: "r", Domain: key.Domain, PolicyID: 99}, Policy: rate, Hits: 1, Min: 1})
				}
			}
			// Items sharing a key must share a policy.
			for i := range items {
				if items[i].Key.PolicyID == 99 {
					items[i].Policy = rate
				} else {
					items[i].Policy = quotas[(items[i].Key.PolicyID-1)%uint64(len(quotas))]
				}
			}
			var want []tiers.Decision
			for k, s := range stores {
				got := make([]tiers.Decision, len(items))
				if err := s.Decide(ctx, now, items, got); err != nil {
					t.Fatalf("seed %d step %d: %s: %v", seed, step, names[k], err)
				}
				if k == 0 {
					want = got
					continue
				}
				if diff := cmp.Diff(want, got); diff != "" {
					for _, p := range quotas {
						t.Logf("%+v", p.Quota)
					}
					t.Fatalf("seed %d step %d at %v, items %+v (-%s +%s):\n%s", seed, step, now, items, names[0], names[k], diff)
				}
			}
		}
	}
}

// TestQuotaRedisClock: under Redis's own clock, a daily quota in a zone
// far from UTC answers its reset at that zone's next midnight, as the Go
// procedure computes it from the process's now.
func TestQuotaRedisClock(t *testing.T) {
	_, c := singleClient(t)
	s := testStore(t, c, Options{})
	loc, err := time.LoadLocation("Asia/Tokyo")
	if err != nil {
		t.Fatal(err)
	}
	p := &tiers.Policy{Kind: tiers.KindQuota, Quota: tiers.Quota{Limit: 2, Period: tiers.PeriodDay, Location: loc}}
	items := []store.Item{{Key: store.Key{Resource: "q", Domain: "d", PolicyID: 1}, Policy: p, Hits: 1, Min: 1}}
	out := make([]tiers.Decision, 1)
	for i := range 3 {
		now := time.Now()
		if err := s.Decide(context.Background(), now, items, out); err != nil {
			t.Fatal(err)
		}
		_, end := p.Quota.Bounds(now)
		if got, want := out[0].OK, i < 2; got != want {
			t.Fatalf("request %d: OK %v, want %v", i, got, want)
		}
		reset := out[0].ResetAfter
		if d := end.Sub(now) - reset; d < -time.Second || d > time.Second {
			t.Fatalf("request %d: reset after %v, want about %v (the next midnight in Tokyo)", i, reset, end.Sub(now))
		}
	}
}
