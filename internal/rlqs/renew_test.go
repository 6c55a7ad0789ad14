package rlqs

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// sends follows the actions the streams were sent, bucket by bucket: when
// each was last sent, and whether it was the same action as before (a
// renewal).
type sends struct {
	last map[string]sent // by stream index and canonical bucket id
}

type sent struct {
	act Action
	at  time.Time
}

func bucketKey(stream int, act Action) string { return fmt.Sprint(stream, "/", Canonical(act.Bucket)) }

// drain takes every stream's pending actions, sent at now, and returns the
// number of renewals and of other actions among them; gap, when not nil,
// is told each action of a bucket sent before, and the time since.
func (r *sends) drain(ss []*Stream, now time.Time, gap func(key string, prev sent, act Action, d time.Duration)) (renewals, others int) {
	if r.last == nil {
		r.last = map[string]sent{}
	}
	for i, s := range ss {
		if s == nil {
			continue
		}
		for _, act := range s.Pending() {
			key := bucketKey(i, act)
			prev, ok := r.last[key]
			if ok && gap != nil {
				gap(key, prev, act, now.Sub(prev.at))
			}
			if ok && cmp.Equal(prev.act, act) {
				renewals++
			} else {
				others++
			}
			if act.Kind == Abandon {
				delete(r.last, key)
				continue
			}
			r.last[key] = sent{act, now}
		}
	}
	return renewals, others
}

// TestRenewalsSpread: streams whose buckets were all assigned on one tick,
// reporting steady demands, renew about as many assignments at every tick
// (each every period ticks, as before), not all on one tick of the period.
func TestRenewalsSpread(t *testing.T) {
	for _, tc := range []struct {
		interval, ttl time.Duration
		period        int  // ticks between two renewals of an assignment
		unmatched     bool // buckets no rule limits: fallbacks of TTL ttl
	}{
		{time.Second, 3 * time.Second, 2, false}, // the defaults: renewed 1.5 s before expiry, at 2 s
		{time.Second, 5 * time.Second, 4, false},
		{500 * time.Millisecond, 3 * time.Second, 5, false},
		{time.Second, time.Second, 1, false}, // no room: every tick, as before
		{time.Second, 5 * time.Second, 4, true},
	} {
		t.Run(fmt.Sprintf("interval %v TTL %v unmatched %v", tc.interval, tc.ttl, tc.unmatched), func(t *testing.T) {
			const streams, buckets = 40, 10
			o := Options{Interval: tc.interval, TTL: tc.ttl}
			key := "user"
			if tc.unmatched {
				o = Options{Interval: tc.interval, UnmatchedTTL: tc.ttl}
				key = "nope"
			}
			f := newFixture(t, o)
			ctx := context.Background()
			ss := make([]*Stream, streams)
			for i := range ss {
				ss[i] = f.a.Open()
			}
			usages := make([]Usage, buckets)
			reportAll := func(elapsed time.Duration) {
				for i, s := range ss {
					for k := range usages {
						usages[k] = Usage{Bucket: map[string]string{key: fmt.Sprint("u", k)}, Elapsed: elapsed,
							Allowed: uint64(i%7 + k)}
					}
					if err := s.Report(ctx, "web", usages); err != nil {
						t.Fatal(err)
					}
				}
			}
			var r sends
			reportAll(0)
			f.a.Flush(ctx)
			r.drain(ss, f.clk.Now(), nil)
			var per []int // renewals per tick, after the warm-up
			warm := 3
			ticks := warm + 6*tc.period
			for i := 1; i <= ticks; i++ {
				f.clk.Advance(tc.interval)
				reportAll(tc.interval)
				f.a.Tick(ctx)
				renewals, others := r.drain(ss, f.clk.Now(), nil)
				if i <= warm {
					continue // the first rates split every budget: every assignment changes
				}
				if others != 0 {
					t.Fatalf("tick %d: %d assignments changed, want steady shares", i, others)
				}
				per = append(per, renewals)
			}
			total, most := 0, 0
			for _, n := range per {
				total += n
				most = max(most, n)
			}
			mean := float64(total) / float64(len(per))
			t.Logf("renewals per tick: %v", per)
			// As before, each assignment is renewed once every period ticks:
			// spreading sends nothing more.
			if want := streams * buckets / tc.period; mean != float64(want) {
				t.Errorf("renewals per tick: mean %.1f, want %d (%d buckets every %d ticks): %v",
					mean, want, streams*buckets, tc.period, per)
			}
			if float64(most) > 1.5*mean {
				t.Errorf("renewals per tick: max %d > 1.5 × mean %.1f: %v", most, mean, per)
			}
		})
	}
}

// TestRenewedNoLaterThanDue: with streams and buckets joining between
// ticks, demands moving (assignments changing), streams closing, buckets no
// rule limits and late ticks, every assignment is sent again at the latest
// at the first tick at least TTL - 1.5 intervals after it was last sent
// (the rule before renewals were spread), so it keeps at least that margin
// before it expires; and some are renewed earlier.
func TestRenewedNoLaterThanDue(t *testing.T) {
	for _, o := range []Options{
		{UnmatchedTTL: 10 * time.Second},
		{TTL: 5 * time.Second, UnmatchedTTL: 7 * time.Second},
		{Interval: 500 * time.Millisecond, TTL: 4 * time.Second, UnmatchedTTL: 3 * time.Second},
	} {
		t.Run(fmt.Sprintf("interval %v TTL %v unmatched %v", o.Interval, o.TTL, o.UnmatchedTTL), func(t *testing.T) {
			o.IdleAfter = time.Hour
			f := newFixture(t, o)
			interval := f.a.o.Interval
			ctx := context.Background()
			rnd := rand.New(rand.NewPCG(1, 2))
			ids := []map[string]string{search, {"user": "a"}, {"user": "b"}, {"api": "nope"}}
			type state struct {
				rates map[int]uint64 // by index in ids
			}
			var ss []*Stream
			var st []state
			var r sends
			renewed, early, total := 0, 0, 0
			// report has stream i report its buckets, new ones with no
			// elapsed time (Envoy's first report of a bucket).
			report := func(i int, elapsed time.Duration, fresh map[int]bool) {
				var us []Usage
				for k, rate := range st[i].rates {
					e := elapsed
					if fresh[k] {
						e = 0
					}
					us = append(us, Usage{Bucket: ids[k], Elapsed: e, Allowed: rate * uint64(max(e, interval)/interval)})
				}
				if err := ss[i].Report(ctx, "web", us); err != nil {
					t.Fatal(err)
				}
			}
			lastTick := f.clk.Now()
			gap := func(key string, prev sent, _ Action, d time.Duration) {
				// Not due at the last tick (checked below), so sent again
				// within a tick's spacing of due.
				if limit := prev.act.TTL - interval - interval/2 + f.clk.Now().Sub(lastTick); d >= limit {
					t.Errorf("%s: sent again %v after %+v, want under %v", key, d, prev.act, limit)
				}
			}
			for tick := 1; tick <= 150; tick++ {
				// Between ticks: new streams, new buckets, Flush. A tick
				// may come late (Run's ticker drops the ticks it could not
				// deliver): the phases then no longer fall on time.
				spacing := interval
				if rnd.IntN(12) == 0 {
					spacing += time.Duration(1+rnd.IntN(10)) * interval / 10
				}
				frac := time.Duration(rnd.IntN(10)) * interval / 10
				f.clk.Advance(frac)
				if len(ss) < 30 && rnd.IntN(2) == 0 {
					ss = append(ss, f.a.Open())
					st = append(st, state{rates: map[int]uint64{}})
				}
				for i := range ss {
					if ss[i] == nil || rnd.IntN(8) != 0 {
						continue
					}
					k := rnd.IntN(len(ids))
					if _, ok := st[i].rates[k]; !ok {
						st[i].rates[k] = uint64(1 + rnd.IntN(60))
						report(i, 0, map[int]bool{k: true})
					}
				}
				f.a.Flush(ctx)
				n, m := r.drain(ss, f.clk.Now(), gap)
				total += n + m
				// The tick: every stream reports; some demands move, some
				// streams close.
				f.clk.Advance(spacing - frac)
				now := f.clk.Now()
				for i := range ss {
					if ss[i] == nil {
						continue
					}
					if rnd.IntN(60) == 0 {
						ss[i].Close()
						ss[i] = nil
						for key := range r.last {
							if strings.HasPrefix(key, fmt.Sprint(i, "/")) {
								delete(r.last, key)
							}
						}
						continue
					}
					for k := range st[i].rates {
						if rnd.IntN(10) == 0 {
							st[i].rates[k] = uint64(1 + rnd.IntN(60))
						}
					}
					report(i, interval, nil)
				}
				due := map[string]bool{}
				for key, p := range r.last {
					if now.Sub(p.at) >= p.act.TTL-interval-interval/2 {
						due[key] = true
					}
				}
				f.a.Tick(ctx)
				n, m = r.drain(ss, now, func(key string, prev sent, act Action, d time.Duration) {
					gap(key, prev, act, d)
					delete(due, key)
					if cmp.Equal(prev.act, act) {
						renewed++
						if d < prev.act.TTL-interval-interval/2 {
							early++
						}
					}
				})
				total += n + m
				lastTick = now
				for key := range due {
					t.Errorf("tick %d: %s is due (last sent %+v at %v, %v ago) and was not sent", tick, key,
						r.last[key].act, r.last[key].at, now.Sub(r.last[key].at))
				}
			}
			t.Logf("%d actions sent, %d renewals, %d of them before due", total, renewed, early)
			if renewed == 0 || early == 0 {
				t.Errorf("%d renewals, %d of them before due: want some of each", renewed, early)
			}
		})
	}
}
