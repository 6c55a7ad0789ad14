package escrow

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/tiers"
)

// clock is a settable clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

// newClock returns a clock an hour ahead of the present. Under the
// caller's clock Redis still expires a key on its own clock, at the
// instant of the caller's that the state is forgotten (SET ... PXAT): a
// caller's clock behind Redis's forgets hits that are still in their
// window, and a pair is granted more than its limit. A test clock moves
// only when told, while Redis's runs on: a run slowed down (a loaded
// machine, the race detector) fell several seconds behind within one
// trace. An hour ahead, Redis's clock never passes it; ahead is safe (a
// key lives longer than it needs to).
func newClock() *clock { return &clock{t: time.Now().Add(time.Hour).Truncate(time.Millisecond)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Add(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
	return c.t
}

// recorder is a Leaser in front of a shared store that tells what went
// through it: the reservations (at, hits granted), the hits given back per
// reservation, the hits granted by decisions of more than 0 hits, and the
// calls.
type recorder struct {
	Leaser
	mu       sync.Mutex
	reserved map[leaseID]int64
	back     map[leaseID]int64
	granted  map[store.Key]int64
	calls    int
	decides  int
}

// leaseID names a reservation.
type leaseID struct {
	key store.Key
	at  time.Time
}

func newRecorder(l Leaser) *recorder {
	return &recorder{Leaser: l, reserved: map[leaseID]int64{}, back: map[leaseID]int64{}, granted: map[store.Key]int64{}}
}

func (r *recorder) Decide(ctx context.Context, now time.Time, items []store.Item, out []tiers.Decision) error {
	err := r.Leaser.Decide(ctx, now, items, out)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	r.decides++
	if err == nil && committed(items, out) {
		for i := range items {
			if !items[i].Refund && out[i].OK {
				r.granted[items[i].Key] += out[i].Granted
			}
		}
	}
	return err
}

func (r *recorder) Reserve(ctx context.Context, now time.Time, after time.Duration, items []store.Item, out []tiers.Decision) (time.Time, error) {
	at, err := r.Leaser.Reserve(ctx, now, after, items, out)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	if err == nil && out[0].OK {
		r.reserved[leaseID{items[0].Key, at}] += out[0].Granted
	}
	return at, err
}

func (r *recorder) GiveBack(ctx context.Context, now, at time.Time, items []store.Item) error {
	err := r.Leaser.GiveBack(ctx, now, at, items)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	if err == nil {
		r.back[leaseID{items[0].Key, at}] += items[0].Hits
	}
	return err
}

// held returns the hits reserved less those given back, over every lease
// of the pairs keys says (nil: every pair).
func (r *recorder) held(keys func(store.Key) bool) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var n int64
	for id, h := range r.reserved {
		if keys == nil || keys(id.key) {
			n += h - r.back[id]
		}
	}
	return n
}

// stats returns the calls, the Decide calls, and the hits granted by
// Decide calls of the pairs keys says (nil: every pair).
func (r *recorder) stats(keys func(store.Key) bool) (calls, decides int, granted int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, n := range r.granted {
		if keys == nil || keys(k) {
			granted += n
		}
	}
	return r.calls, r.decides, granted
}

// committed reports whether a Decide's answers committed its takes (no
// non-shadow take rejected).
func committed(items []store.Item, out []tiers.Decision) bool {
	for i := range items {
		if !items[i].Refund && !items[i].Shadow && items[i].Hits > 0 && !out[i].OK {
			return false
		}
	}
	return true
}

// sliding is a rate_limit of limit per w.
func sliding(limit int64, w time.Duration) *tiers.Policy {
	return &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: limit, Window: w, Active: tiers.Unbounded}}}
}

func item(key string, p *tiers.Policy, hits int64) store.Item {
	return store.Item{Key: store.Key{Resource: "r/" + key, Domain: "d", PolicyID: 7}, Policy: p, Hits: hits, Min: hits}
}

func newMem(t testing.TB) *memstore.Store {
	t.Helper()
	m := memstore.New(memstore.Options{MaxKeys: -1})
	t.Cleanup(func() { m.Close() })
	return m
}

// newEscrow returns a Store on shared with opts, on clk, escrow on by
// default, closed when the test ends.
func newEscrow(t testing.TB, shared Leaser, clk *clock, opts Options) *Store {
	t.Helper()
	opts.Remote = shared
	opts.Default = true
	opts.Now = clk.Now
	if opts.Size == SizeFair && opts.Shares == nil {
		opts.Size = SizeDemand
	}
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// decide decides items at now on s, failing the test on an error.
func decide(t testing.TB, s store.Store, now time.Time, items ...store.Item) []tiers.Decision {
	t.Helper()
	out := make([]tiers.Decision, len(items))
	if err := s.Decide(context.Background(), now, items, out); err != nil {
		t.Fatalf("decide: %v", err)
	}
	return out
}

// count returns the hits the shared store counts in the window of it's
// pair at now (this tier's window).
func count(t testing.TB, s store.Store, now time.Time, it store.Item) int64 {
	t.Helper()
	out := make([]tiers.Decision, 1)
	check := it
	check.Hits, check.Min = 0, 0
	if err := s.Decide(context.Background(), now, []store.Item{check}, out); err != nil {
		t.Fatal(err)
	}
	return out[0].TierHits
}
