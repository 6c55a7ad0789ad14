package rlqs

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/charonlimit/charon/internal/sharestore"
)

// counting is a Memory store that counts the splits and the renewals, and
// runs hook before each.
type counting struct {
	sharestore.Memory
	mu               sync.Mutex
	splits, renewals int
	hook             func(b sharestore.Budget)
}

func (c *counting) Allocate(ctx context.Context, now time.Time, b sharestore.Budget, mine []sharestore.Demand, ttl time.Duration, tol float64) ([]int64, error) {
	c.mu.Lock()
	c.splits++
	hook := c.hook
	c.mu.Unlock()
	if hook != nil {
		hook(b)
	}
	return c.Memory.Allocate(ctx, now, b, mine, ttl, tol)
}

func (c *counting) Renew(ctx context.Context, now time.Time, b sharestore.Budget, mine []sharestore.Demand, ttl time.Duration) ([]int64, bool, error) {
	c.mu.Lock()
	hook := c.hook
	c.mu.Unlock()
	if hook != nil {
		hook(b)
	}
	shares, ok, err := c.Memory.Renew(ctx, now, b, mine, ttl)
	if ok {
		c.mu.Lock()
		c.renewals++
		c.mu.Unlock()
	}
	return shares, ok, err
}

func (c *counting) counts() (splits, renewals int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.splits, c.renewals
}

// TestSplitOnlyWhenDemandsMove: a tick splits a budget again only when a
// demand changed since the last split; otherwise it renews the leases at
// the shares held, and the assignments are re-sent only when due.
func TestSplitOnlyWhenDemandsMove(t *testing.T) {
	st := &counting{}
	f := newFixture(t, Options{Store: st})
	ctx := context.Background()
	a, b := f.a.Open(), f.a.Open()
	report(t, a, 0, 0, search)
	report(t, b, 0, 0, search)
	second := func(ra, rb uint64) {
		t.Helper()
		f.clk.Advance(time.Second)
		report(t, a, ra, time.Second, search)
		report(t, b, rb, time.Second, search)
		f.a.Tick(ctx)
	}
	for range 3 { // settle: a wants 90 of 100, b 30
		second(90, 30)
	}
	a.Pending()
	b.Pending()
	splits0, renewals0 := st.counts()
	for range 4 {
		second(90, 30) // steady
	}
	splits, renewals := st.counts()
	if splits != splits0 || renewals != renewals0+4 {
		t.Errorf("4 steady ticks: %d splits and %d renewals, want 0 and 4", splits-splits0, renewals-renewals0)
	}
	if p := a.Pending(); len(p) != 1 || p[0].Tokens != 700 {
		t.Errorf("a's renewed assignments over 4 s: %+v, want one of 70 per second, 700 tokens per 10 s (the last, due)", p)
	}
	// b's demand falls by two thirds: one report that far out (3.6
	// standard deviations at 30/s over 1 s) may be chance; two in a row
	// are a change, split at once.
	second(90, 10)
	if splits, _ := st.counts(); splits != splits0 {
		t.Errorf("after one report of b's fall: %d splits, want 0", splits-splits0)
	}
	second(90, 10)
	if splits, _ := st.counts(); splits != splits0+1 {
		t.Errorf("after b's demand fell: %d splits, want 1", splits-splits0)
	}
	if p := a.Pending(); len(p) != 1 || p[0].Tokens <= 700 {
		t.Errorf("a after b's demand fell: %+v, want a larger share", p)
	}
}

// TestOneWakePerTick: a tick wakes a stream's writer once, after every
// budget is allocated, so that its actions of all budgets go out in one
// response.
func TestOneWakePerTick(t *testing.T) {
	st := &counting{}
	f := newFixture(t, Options{Store: st})
	ctx := context.Background()
	alice := map[string]string{"user": "alice"}
	s1, s2 := f.a.Open(), f.a.Open()
	for _, bucket := range []map[string]string{search, alice} {
		report(t, s1, 0, 0, bucket)
	}
	s1.Pending()
	<-s1.Notify()
	// s2 joins both budgets; the tick splits them, shrinking s1's shares.
	if err := s2.Report(ctx, "web", []Usage{{Bucket: search}, {Bucket: alice}}); err != nil {
		t.Fatal(err)
	}
	calls := 0
	st.mu.Lock()
	st.hook = func(sharestore.Budget) {
		if calls++; calls > 1 && len(s1.Notify()) > 0 {
			t.Errorf("s1 woken before the tick's allocation %d", calls)
		}
	}
	st.mu.Unlock()
	f.a.Tick(ctx)
	if calls != 2 {
		t.Fatalf("the tick allocated %d budgets, want 2", calls)
	}
	if len(s1.Notify()) != 1 {
		t.Fatal("s1 not woken after the tick")
	}
	if p := s1.Pending(); len(p) != 2 {
		t.Errorf("s1's actions after the tick: %+v, want both budgets' shares", p)
	}
}

// leases mirrors the leases a store hands out, to check their sum.
type leases struct {
	sharestore.Memory
	mu    sync.Mutex
	now   func() time.Time
	held  map[string]map[string]lease
	worst int64 // the largest sum of live leases seen over a limit
	t     *testing.T
}

type lease struct {
	share   int64
	expires time.Time
}

func (l *leases) record(now time.Time, b sharestore.Budget, mine []sharestore.Demand, shares []int64, ttl time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held == nil {
		l.held = map[string]map[string]lease{}
	}
	h := l.held[b.Key]
	if h == nil {
		h = map[string]lease{}
		l.held[b.Key] = h
	}
	for i, d := range mine {
		h[d.ID] = lease{shares[i], now.Add(ttl)}
	}
	var sum int64
	for _, x := range h {
		if now.Before(x.expires) {
			sum += x.share
		}
	}
	if sum > b.Limit {
		l.t.Errorf("budget %s: live leases sum to %d > limit %d", b.Key, sum, b.Limit)
	}
}

func (l *leases) Allocate(ctx context.Context, now time.Time, b sharestore.Budget, mine []sharestore.Demand, ttl time.Duration, tol float64) ([]int64, error) {
	shares, err := l.Memory.Allocate(ctx, now, b, mine, ttl, tol)
	if err == nil {
		l.record(now, b, mine, shares, ttl)
	}
	return shares, err
}

func (l *leases) Renew(ctx context.Context, now time.Time, b sharestore.Budget, mine []sharestore.Demand, ttl time.Duration) ([]int64, bool, error) {
	shares, ok, err := l.Memory.Renew(ctx, now, b, mine, ttl)
	if ok {
		l.record(now, b, mine, shares, ttl)
	}
	return shares, ok, err
}

// TestConcurrentStreamsNeverExceedTheLimit: streams opening, reporting
// moving demands and closing concurrently with ticks and flushes never hold
// live leases above a budget's limit.
func TestConcurrentStreamsNeverExceedTheLimit(t *testing.T) {
	st := &leases{t: t}
	f := newFixture(t, Options{Store: st})
	ctx := context.Background()
	alice := map[string]string{"user": "alice"}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 7))
			for range 40 {
				s := f.a.Open()
				for i := range 1 + r.IntN(6) {
					elapsed := time.Second
					if i == 0 {
						elapsed = 0
					}
					us := []Usage{{Bucket: search, Elapsed: elapsed, Allowed: uint64(r.IntN(200))}, {Bucket: alice, Elapsed: elapsed, Allowed: uint64(r.IntN(20))}}
					if err := s.Report(ctx, "web", us); err != nil {
						t.Error(err)
						return
					}
					s.Pending()
				}
				if r.IntN(3) > 0 {
					s.Close()
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			f.clk.Advance(250 * time.Millisecond)
			f.a.Flush(ctx)
			f.a.Tick(ctx)
		}
	}()
	wg.Wait()
	close(stop)
	<-done
	if st := f.a.Stats(false); st.Streams == 0 {
		t.Errorf("no stream left open: %+v", st)
	}
}

// TestLookupKeys: a bucket id's lookup key is the same whatever the map's
// order, and differs for different domains or ids, however their strings
// run together.
func TestLookupKeys(t *testing.T) {
	key := func(domain string, id map[string]string) string {
		b, _ := appendLookup(nil, nil, domain, id)
		return string(b)
	}
	if key("web", map[string]string{"a": "1", "b": "2"}) != key("web", map[string]string{"b": "2", "a": "1"}) {
		t.Error("one id, two keys")
	}
	distinct := []struct {
		domain string
		id     map[string]string
	}{
		{"web", map[string]string{"a": "1"}},
		{"we", map[string]string{"ba": "1"}},
		{"web", map[string]string{"a": "1", "b": ""}},
		{"web", map[string]string{"a": "1b"}},
		{"web", map[string]string{"a1": ""}},
		{"web", map[string]string{"a": "", "1": ""}},
	}
	seen := map[string]int{}
	for i, d := range distinct {
		k := key(d.domain, d.id)
		if j, ok := seen[k]; ok {
			t.Errorf("%v and %v share a lookup key", distinct[j], d)
		}
		seen[k] = i
	}
}
