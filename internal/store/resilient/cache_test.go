package resilient_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/resilient"
	"github.com/charonlimit/charon/internal/store/storetest"
	"github.com/charonlimit/charon/tiers"
)

// exhausted returns a wrapper whose remote has rejected "a" once at t0 (3 of
// 3 hits taken), so that a's rejection is cached, and the rejection.
func exhausted(t *testing.T, opts resilient.Options) (*resilient.Store, *fakeRemote, tiers.Decision) {
	t.Helper()
	f := newFake()
	s := resilient.New(f, opts)
	t.Cleanup(func() { s.Close() })
	storetest.Decide(t, s, t0, take(simple, "a", 3))
	d := storetest.Decide(t, s, t0.Add(100*time.Millisecond), take(simple, "a", 1))[0]
	if d.OK || d.RetryAfter != 900*time.Millisecond {
		t.Fatalf("setup: %+v, want a rejection with RetryAfter 900ms", d)
	}
	return s, f, d
}

func TestCacheShortCircuits(t *testing.T) {
	s, f, rejected := exhausted(t, resilient.Options{})
	at := t0.Add(100 * time.Millisecond)
	for _, dt := range []time.Duration{0, 300 * time.Millisecond, 900*time.Millisecond - time.Microsecond} {
		got := storetest.Decide(t, s, at.Add(dt), take(simple, "a", 1))
		want := rejected
		want.RetryAfter, want.ResetAfter = 900*time.Millisecond-dt, 900*time.Millisecond-dt
		if diff := cmp.Diff(want, got[0]); diff != "" {
			t.Errorf("+%v: cached decision (-want +got):\n%s", dt, diff)
		}
	}
	if got := f.calls.Load(); got != 2 {
		t.Errorf("%d remote calls, want 2 (the setup's)", got)
	}
	// Two items of one key ask for a summed minimum of 2, not the cached 1.
	storetest.Decide(t, s, at, take(simple, "a", 1), take(simple, "a", 1))
	if got := f.calls.Load(); got != 3 {
		t.Errorf("a request for a summed minimum of 2 was answered from the cache")
	}
	storetest.Decide(t, s, at, take(simple, "a", 1), take(simple, "a", 1))
	if got := f.calls.Load(); got != 3 {
		t.Errorf("the rejection for a minimum of 2 was not cached")
	}
	// At exactly T the pair may be granted: the remote decides.
	got := storetest.Decide(t, s, at.Add(900*time.Millisecond), take(simple, "a", 1), take(simple, "a", 1))
	if !got[0].OK || f.calls.Load() != 4 {
		t.Errorf("at T: %+v after %d remote calls, want a remote grant", got[0], f.calls.Load())
	}
	st := s.Stats()
	if st.Cached != 4 || st.CacheHits != 4 || st.CacheMisses != 4 || st.Remote != 4 {
		t.Errorf("stats %+v; want 4 cached calls and hits, 4 misses, 4 remote", st)
	}
}

func TestCacheRules(t *testing.T) {
	at := t0.Add(200 * time.Millisecond)
	tests := []struct {
		name   string
		before func(t *testing.T, s *resilient.Store) // between the rejection and the request
		items  []store.Item
		remote bool // the request goes to the remote
		ok     []bool
	}{
		{"cached", nil, []store.Item{take(simple, "a", 1)}, false, []bool{false}},
		{"granted in a rejected request", func(t *testing.T, s *resilient.Store) {
			// a is cached, b is not: the remote rejects both, b with OK.
			storetest.Decide(t, s, t0.Add(100*time.Millisecond), take(simple, "a", 1), take(simple, "b", 1))
		}, []store.Item{take(simple, "b", 1), take(simple, "a", 1)}, true, []bool{true, false}},
		{"mixed with an uncached key", nil, []store.Item{take(simple, "b", 1), take(simple, "a", 1)}, true, []bool{true, false}},
		{"other minimum", nil, []store.Item{take(simple, "a", 2)}, true, []bool{false}},
		{"other policy ID", nil, []store.Item{{Key: store.Key{Resource: "r", Domain: "a", PolicyID: 2}, Policy: simple, Hits: 1, Min: 1}}, true, []bool{true}},
		// The same state under a raised limit (a request's own limit that
		// changed): the rejection was the old limit's.
		{"other limits on the key", nil, []store.Item{take(&tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 4, Window: time.Second, Active: tiers.Unbounded}}}, "a", 1)}, true, []bool{true}},
		{"flushed", func(_ *testing.T, s *resilient.Store) { s.Flush() }, []store.Item{take(simple, "a", 1)}, true, []bool{false}},
		{"refund", nil, []store.Item{refund(simple, "a", 1), take(simple, "a", 1)}, true, []bool{true, true}},
		{"refunded before", func(t *testing.T, s *resilient.Store) {
			storetest.Decide(t, s, t0.Add(100*time.Millisecond), refund(simple, "a", 1))
		}, []store.Item{take(simple, "a", 1)}, true, []bool{true}},
		{"shadow", nil, []store.Item{shadowed(take(simple, "a", 1))}, false, []bool{false}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, f, _ := exhausted(t, resilient.Options{})
			if tt.before != nil {
				tt.before(t, s)
			}
			calls := f.calls.Load()
			got := storetest.Decide(t, s, at, tt.items...)
			if remote := f.calls.Load() > calls; remote != tt.remote {
				t.Errorf("remote called: %v, want %v", remote, tt.remote)
			}
			oks := make([]bool, len(got))
			for i, d := range got {
				oks[i] = d.OK
			}
			if diff := cmp.Diff(tt.ok, oks); diff != "" {
				t.Errorf("OK per item (-want +got):\n%s\n%+v", diff, got)
			}
		})
	}
}

func shadowed(it store.Item) store.Item {
	it.Shadow = true
	return it
}

func TestCacheShadowRejectionNotCached(t *testing.T) {
	f := newFake()
	s := resilient.New(f, resilient.Options{})
	defer s.Close()
	storetest.Decide(t, s, t0, take(simple, "a", 3))
	storetest.Decide(t, s, t0, shadowed(take(simple, "a", 1)))
	storetest.Decide(t, s, t0, shadowed(take(simple, "a", 1)))
	if got := f.calls.Load(); got != 3 {
		t.Errorf("%d remote calls, want 3: a shadow rejection is not cached", got)
	}
}

// TestCacheConcurrencyNotCached: a concurrency limit's rejection is not
// cached: its slots come back with refunds, which another process may
// make, not at its RetryAfter.
func TestCacheConcurrencyNotCached(t *testing.T) {
	f := newFake()
	s := resilient.New(f, resilient.Options{})
	defer s.Close()
	conc := &tiers.Policy{Kind: tiers.KindTiers, Concurrency: true, Tiers: []tiers.Tier{{Limit: 1, Window: time.Minute, Active: tiers.Unbounded}}}
	storetest.Decide(t, s, t0, take(conc, "a", 1))
	for range 2 {
		if d := storetest.Decide(t, s, t0, take(conc, "a", 1))[0]; d.OK {
			t.Fatal("a second slot of one")
		}
	}
	if got := f.calls.Load(); got != 3 {
		t.Errorf("%d remote calls, want 3: a concurrency limit's rejection is not cached", got)
	}
}

func TestCacheUnbounded(t *testing.T) {
	f := newFake()
	s := resilient.New(f, resilient.Options{})
	defer s.Close()
	d := storetest.Decide(t, s, t0, take(closed, "a", 1))[0]
	if d.OK || d.RetryAfter != tiers.Unbounded {
		t.Fatalf("closed resource: %+v, want RetryAfter Unbounded", d)
	}
	got := storetest.Decide(t, s, t0.Add(1000*time.Hour), take(closed, "a", 1))[0]
	if got.OK || got.RetryAfter != tiers.Unbounded || got.ResetAfter != tiers.Unbounded || f.calls.Load() != 1 {
		t.Errorf("a day later: %+v after %d remote calls, want the cached Unbounded rejection", got, f.calls.Load())
	}
}

// TestCacheGlobalRefund: a refund to one domain of a resource with a global
// limit can make another domain grantable at once; the cache must not hide it.
func TestCacheGlobalRefund(t *testing.T) {
	f := newFake()
	s := resilient.New(f, resilient.Options{})
	defer s.Close()
	storetest.Decide(t, s, t0, take(global, "a", 4))
	if d := storetest.Decide(t, s, t0, take(global, "b", 1))[0]; d.OK || d.RetryAfter <= 0 {
		t.Fatalf("b: %+v, want a rejection by the global limit with a wait", d)
	}
	storetest.Decide(t, s, t0, take(global, "b", 1))
	if f.calls.Load() != 2 {
		t.Fatalf("b's rejection not cached")
	}
	storetest.Decide(t, s, t0, refund(global, "a", 1))
	if d := storetest.Decide(t, s, t0, take(global, "b", 1))[0]; !d.OK {
		t.Errorf("after a's refund b is grantable, got %+v", d)
	}
}

// TestCacheGlobalCut: a rejection by the global limit is cached only when
// no other group of the request shares the global state (store.Plan): when
// one does, the room may have gone to it (store.Apply's cut), and the pair
// alone may be granted at once. A pair of the resource whose policy has no
// global limit shares nothing.
func TestCacheGlobalCut(t *testing.T) {
	f := newFake()
	s := resilient.New(f, resilient.Options{})
	defer s.Close()
	storetest.Decide(t, s, t0, take(global, "x", 3)) // room left: 1
	got := storetest.Decide(t, s, t0, take(global, "a", 1), take(global, "b", 1))
	if !got[0].OK || got[1].OK || !got[1].LimitedByGlobal || got[1].RetryAfter <= 0 {
		t.Fatalf("a, b: %+v, want a granted (predicted, not committed) and b cut by the global limit", got)
	}
	if d := storetest.Decide(t, s, t0, take(global, "b", 1))[0]; !d.OK || f.calls.Load() != 3 {
		t.Errorf("b alone after the cut: %+v after %d remote calls, want the remote's grant", d, f.calls.Load())
	}
	// The room is gone: b rejected beside a pair without a global limit is
	// cached.
	got = storetest.Decide(t, s, t0, take(simple, "c", 1), take(global, "b", 1))
	if got[1].OK || !got[1].LimitedByGlobal {
		t.Fatalf("c, b: %+v, want b rejected by the global limit", got)
	}
	if d := storetest.Decide(t, s, t0, take(global, "b", 1))[0]; d.OK || f.calls.Load() != 4 {
		t.Errorf("b alone: %+v after %d remote calls, want its cached rejection (4 calls)", d, f.calls.Load())
	}
}

func TestCacheTimeBackwards(t *testing.T) {
	s, f, _ := exhausted(t, resilient.Options{})
	calls := f.calls.Load()
	storetest.Decide(t, s, t0, take(simple, "a", 1))
	if f.calls.Load() != calls+1 {
		t.Errorf("a request dated before the cached rejection was answered from the cache")
	}
}

func TestCacheDisabled(t *testing.T) {
	s, f, _ := exhausted(t, resilient.Options{CacheSize: -1})
	storetest.Decide(t, s, t0.Add(200*time.Millisecond), take(simple, "a", 1))
	if f.calls.Load() != 3 || s.Stats().CacheMisses != 0 {
		t.Errorf("cache off: %d remote calls, stats %+v; want 3 and no cache counts", f.calls.Load(), s.Stats())
	}
}

func TestCacheBounded(t *testing.T) {
	f := newFake()
	s := resilient.New(f, resilient.Options{CacheSize: 64})
	defer s.Close()
	for i := range 500 {
		storetest.Decide(t, s, t0, take(closed, fmt.Sprint("d", i), 1))
	}
	st := s.Stats()
	if st.CacheSize > 64+63 || st.CacheSize+int(st.CacheEvictions) != 500 {
		t.Errorf("stats %+v; want at most 64 (+ rounding) entries, size + evictions = 500", st)
	}
	s.Flush()
	if st := s.Stats(); st.CacheSize != 0 {
		t.Errorf("after Flush: size %d", st.CacheSize)
	}
}

// TestCacheExactAgainstRemote replays random traces through a wrapper with
// the cache and through a bare remote, and demands the same outcome: OK,
// Granted, RetryAfter and ResetAfter of every item. Only the rest of a cached
// rejection's context (hits, remaining) may be older.
func TestCacheExactAgainstRemote(t *testing.T) {
	policies := []*tiers.Policy{
		simple, global, closed,
		{Kind: tiers.KindTiers, HardLimit: 6, Tiers: []tiers.Tier{{Limit: 4, Window: time.Second, Active: tiers.Unbounded}, {Limit: 8, Window: 2 * time.Second, Active: 4 * time.Second, Cooldown: 2 * time.Second, Skippable: true}}},
		{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 5, Window: time.Second, Active: tiers.Unbounded}, {Limit: 10, Window: time.Second, Active: 5 * time.Second, Cooldown: 15 * time.Second}}},
		{Kind: tiers.KindTokenBucket, Bucket: tiers.TokenBucket{Capacity: 5, Refill: 2, Per: time.Second}},
		{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Limit: 3, Unit: tiers.UnitSecond}},
	}
	for seed := range uint64(4) {
		s := resilient.New(newFake(), resilient.Options{})
		ref := newFake()
		tr := storetest.Trace{Seed: seed, Steps: 5000, Gap: 60 * time.Millisecond, Items: 2, Domains: 2, Policies: policies}
		tr.Replay(t, s, ref, func(step int, now time.Time, items []store.Item, got, want []tiers.Decision) {
			for i := range items {
				g, w := got[i], want[i]
				if g.OK != w.OK || g.Granted != w.Granted || g.RetryAfter != w.RetryAfter || g.ResetAfter != w.ResetAfter {
					t.Fatalf("seed %d step %d at +%v, item %d of %+v: got %+v, want %+v", seed, step, now.Sub(t0), i, items, g, w)
				}
			}
		})
		st := s.Stats()
		if st.Cached < 200 {
			t.Errorf("seed %d: only %d calls answered from the cache: the trace does not exercise it", seed, st.Cached)
		}
		s.Close()
		ref.Close()
	}
}

// TestCacheBeforeBreaker: a cached rejection is the remote's own answer, so
// it still holds while the remote is down, in every mode.
func TestCacheBeforeBreaker(t *testing.T) {
	s, f, _ := exhausted(t, resilient.Options{Mode: resilient.ModeOpen})
	f.set(fail)
	if d := storetest.Decide(t, s, t0.Add(200*time.Millisecond), take(simple, "a", 1))[0]; d.OK {
		t.Errorf("remote down, a cached: %+v, want the cached rejection", d)
	}
	if d := storetest.Decide(t, s, t0.Add(200*time.Millisecond), take(simple, "b", 1))[0]; !d.OK {
		t.Errorf("remote down, b not cached: %+v, want open mode's grant", d)
	}
	if st := s.Stats(); st.Cached != 1 || st.Open != 1 {
		t.Errorf("stats %+v; want 1 cached, 1 open", st)
	}
}

// A post-paid pair's hits reach the remote even while its rejection is
// cached: they are debited whatever the answer. With DebtInterval negative
// each refused request's hits go at once; its checks of 0 hits may be
// answered from the cache.
func TestCachePostPaidDebitsReachRemote(t *testing.T) {
	f := newFake()
	s := resilient.New(f, resilient.Options{DebtInterval: -1})
	t.Cleanup(func() { s.Close() })
	pp := *simple
	pp.Overdraft = true
	storetest.Decide(t, s, t0, take(&pp, "a", 4)) // 3 granted, 1 owed: in debt
	check := take(&pp, "a", 0)
	check.Min = 0
	if d := storetest.Decide(t, s, t0.Add(100*time.Millisecond), check)[0]; d.OK {
		t.Fatalf("a check in debt: %+v, want a rejection", d)
	}
	calls := f.calls.Load()
	if d := storetest.Decide(t, s, t0.Add(200*time.Millisecond), check)[0]; d.OK || f.calls.Load() != calls {
		t.Errorf("a second check in debt: OK %v after %d remote calls, want a cached rejection (%d calls)", d.OK, f.calls.Load(), calls)
	}
	for i := range 3 {
		storetest.Decide(t, s, t0.Add(300*time.Millisecond), take(&pp, "a", 1))
		if got := f.calls.Load(); got != calls+int64(i)+1 {
			t.Fatalf("post-paid take %d: %d remote calls, want %d", i, got, calls+int64(i)+1)
		}
	}
}

// TestCachePostPaidDebtsSummed: the refused hits of a post-paid pair in
// debt are answered from the cache and summed, then sent in one call (here
// by Settle: the interval is an hour); the remote then holds exactly the
// debt a remote asked request by request holds, answers the same
// RetryAfter, and another process on the same remote refuses the pair as
// long. Close sends what is summed too.
func TestCachePostPaidDebtsSummed(t *testing.T) {
	pp := *hourly // 50 an hour: a debt lasts
	pp.Overdraft = true
	f, ref := newFake(), newFake()
	s := resilient.New(f, resilient.Options{DebtInterval: time.Hour})
	defer s.Close()
	other := resilient.New(f, resilient.Options{CacheSize: -1})
	defer other.Close()
	both := func(at time.Time, hits int64) (got, want tiers.Decision) {
		return storetest.Decide(t, s, at, take(&pp, "a", hits))[0], storetest.Decide(t, ref, at, take(&pp, "a", hits))[0]
	}
	both(t0, 60) // 50 granted, 10 owed: in debt
	if g, w := both(t0.Add(time.Second), 1); g.OK || w.OK {
		t.Fatalf("in debt: %+v, reference %+v; want rejections", g, w)
	}
	calls := f.calls.Load()
	at := t0.Add(2 * time.Second)
	for i := range 100 {
		if g, _ := both(at, 1); g.OK {
			t.Fatalf("refused take %d: granted", i)
		}
	}
	if got := f.calls.Load(); got != calls {
		t.Errorf("%d remote calls for 100 refused takes in debt, want 0 before the flush", got-calls)
	}
	if st := s.Stats(); st.DebtDeferred != 100 || st.DebtFlushes != 0 {
		t.Errorf("stats %+v: want 100 deferred, 0 flushes", st)
	}
	if err := s.Settle(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := f.calls.Load(); got != calls+1 {
		t.Errorf("%d remote calls to send 100 summed debits, want 1", got-calls)
	}
	it := take(&pp, "a", 1)
	vg, _ := f.mem.Inspect(context.Background(), at, &it)
	vw, _ := ref.mem.Inspect(context.Background(), at, &it)
	if diff := cmp.Diff(vw, vg); diff != "" {
		t.Errorf("the pair's state after the flush (-asked one by one +summed):\n%s", diff)
	}
	later := at.Add(time.Minute)
	g, w := both(later, 1)
	if g.OK || g.RetryAfter != w.RetryAfter {
		t.Errorf("after the flush: %+v, reference %+v: want the same RetryAfter", g, w)
	}
	if d := storetest.Decide(t, other, later, take(&pp, "a", 1))[0]; d.OK || d.RetryAfter < w.RetryAfter {
		t.Errorf("another process after the flush: %+v, want a rejection for at least %v", d, w.RetryAfter)
	}
	storetest.Decide(t, ref, later, take(&pp, "a", 1)) // the other process's debit
	calls = f.calls.Load()
	storetest.Decide(t, s, later, take(&pp, "a", 1))
	storetest.Decide(t, ref, later, take(&pp, "a", 1))
	if err := s.Settle(context.Background()); err != nil {
		t.Fatal(err)
	}
	vg, _ = f.mem.Inspect(context.Background(), later, &it)
	vw, _ = ref.mem.Inspect(context.Background(), later, &it)
	if diff := cmp.Diff(vw, vg); diff != "" {
		t.Errorf("the pair's state after the second flush (-asked one by one +summed):\n%s", diff)
	}
	if got := f.calls.Load(); got != calls+1 {
		t.Errorf("%d remote calls for a refused take and its flush, want 1", got-calls)
	}
	// Close sends what is summed before it closes the remote.
	storetest.Decide(t, s, later, take(&pp, "a", 1))
	s.Close()
	if got := f.calls.Load(); got != calls+2 {
		t.Errorf("Close sent %d calls, want 1: the summed debit", got-calls-1)
	}
}

// inDebt returns a wrapper (DebtInterval interval) whose remote f has the
// post-paid pair "a" in debt for an hour, its rejection cached.
func inDebt(t *testing.T, interval time.Duration) (*resilient.Store, *fakeRemote, *tiers.Policy) {
	t.Helper()
	pp := *hourly
	pp.Overdraft = true
	f := newFake()
	s := resilient.New(f, resilient.Options{DebtInterval: interval})
	t.Cleanup(func() { s.Close() })
	storetest.Decide(t, s, t0, take(&pp, "a", 60))
	if d := storetest.Decide(t, s, t0.Add(time.Second), take(&pp, "a", 1))[0]; d.OK {
		t.Fatalf("setup: %+v, want a rejection", d)
	}
	return s, f, &pp
}

// TestDebtTimerFlushes: without Settle, the interval's timer sends the
// summed debits.
func TestDebtTimerFlushes(t *testing.T) {
	s, f, pp := inDebt(t, time.Millisecond)
	calls := f.calls.Load()
	for range 10 {
		storetest.Decide(t, s, t0.Add(2*time.Second), take(pp, "a", 1))
	}
	deadline := time.Now().Add(20 * time.Second)
	for f.calls.Load() == calls {
		if time.Now().After(deadline) {
			t.Fatal("the summed debits were never sent")
		}
		time.Sleep(time.Millisecond)
	}
	it := take(pp, "a", 1)
	if err := s.Settle(context.Background()); err != nil {
		t.Fatal(err)
	}
	v, _ := f.mem.Inspect(context.Background(), t0.Add(2*time.Second), &it)
	if v.Tiers[0].Hits != 61+10 {
		t.Errorf("the pair holds %d hits, want 71: every refused hit debited once", v.Tiers[0].Hits)
	}
}

// TestDebtFlushFailures: debits the remote certainly did not get (not
// sent in time, breaker open) are sent with the next flush; after an error
// that may have applied them they are not sent again.
func TestDebtFlushFailures(t *testing.T) {
	s, f, pp := inDebt(t, time.Hour)
	at := t0.Add(2 * time.Second)
	it := take(pp, "a", 1)
	hits := func() int64 {
		v, _ := f.mem.Inspect(context.Background(), at, &it)
		return v.Tiers[0].Hits
	}
	storetest.Decide(t, s, at, take(pp, "a", 1))
	f.set(notSent)
	s.Settle(context.Background())
	f.set(answer)
	storetest.Decide(t, s, at, take(pp, "a", 1))
	s.Settle(context.Background())
	if h := hits(); h != 63 {
		t.Errorf("after a flush not sent and another: %d hits, want 63", h)
	}
	storetest.Decide(t, s, at, take(pp, "a", 1))
	f.set(fail)
	s.Settle(context.Background())
	f.set(answer)
	s.Settle(context.Background())
	if h := hits(); h != 63 {
		t.Errorf("after a failed flush: %d hits, want 63 (its debit is not sent twice)", h)
	}
	if st := s.Stats(); st.DebtFlushes != 3 || st.DebtFlushErrors != 2 {
		t.Errorf("stats %+v: want 3 flushes, 2 failed", st)
	}
}
