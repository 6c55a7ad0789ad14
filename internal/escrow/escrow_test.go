package escrow

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/tiers"
)

// heat makes it's pair hot on s at now (a second's worth of decisions of
// 0 hits at its hot rate: checks, which the shared store answers and
// which count nothing).
func heat(t *testing.T, s *Store, now time.Time, it store.Item) {
	t.Helper()
	chk := it
	chk.Hits, chk.Min = 0, 0
	n := int(math.Ceil(s.hotRate(it.Policy)))
	for range n {
		decide(t, s, now, chk)
	}
	if _, ok := s.entries.Load(it.Key); !ok {
		t.Fatalf("%s not in escrow after %d decisions", it.Key.Resource, n)
	}
}

// lease returns the hits s's leases of it's pair hold at now.
func held(s *Store, now time.Time, it store.Item) int64 {
	v, ok := s.entries.Load(it.Key)
	if !ok {
		return 0
	}
	e := v.(*entry)
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.avail(now)
}

// TestCheckGivesBackWhatTheWalkMissed: a reservation for the lease's last
// instant does not see a hit that leaves the window before that instant;
// granting from it at once would put two answers in one window of a limit
// of 1. The check at the present finds the excess and gives it back: the
// lease is refused, and the pair is rejected, as the shared store would.
func TestCheckGivesBackWhatTheWalkMissed(t *testing.T) {
	clk := newClock()
	mem := newMem(t)
	rec := newRecorder(mem)
	p := sliding(1, 10*time.Second)
	s := newEscrow(t, rec, clk, Options{Lease: time.Second, Threshold: 5})
	it := item("a", p, 1)
	t0 := clk.Now()
	if d := decide(t, s, t0, it); !d[0].OK {
		t.Fatalf("first hit: %+v", d[0])
	}
	now := clk.Add(9500 * time.Millisecond)
	heat(t, s, now, it)
	s.Tick(context.Background())
	if got := held(s, now, it); got != 0 {
		t.Fatalf("the lease holds %d hits at 9.5s beside the hit at 0s, want 0", got)
	}
	st := s.Stats()
	if st.Excess != 1 || st.GivenBack != 1 || st.Refused != 1 {
		t.Fatalf("stats %+v: want 1 hit over the limit at the check, given back, the lease refused", st)
	}
	if d := decide(t, s, now, it); d[0].OK {
		t.Fatalf("a hit at 9.5s was granted beside the one at 0s (window 10s, limit 1): %+v", d[0])
	}
	if got := count(t, mem, now, it); got != 1 {
		t.Fatalf("the shared store counts %d hits at 9.5s, want 1 (the one granted)", got)
	}
	// Without the check (the reservation alone) the hit would have been
	// granted: the walk at 10.5s does not count the hit at 0s.
	out := make([]tiers.Decision, 1)
	if _, err := mem.Reserve(context.Background(), now, time.Second, []store.Item{it}, out); err != nil || !out[0].OK {
		t.Fatalf("a reservation for 10.5s: %+v, %v; want it granted (this is what the check is for)", out[0], err)
	}
}

// TestLeaseGrantsLocallyAndGivesBack: a hot pair gets a lease; its
// requests are then decided without a call to the shared store; when the
// lease ends, exactly what it did not grant is given back, and the shared
// store counts exactly the hits granted.
func TestLeaseGrantsLocallyAndGivesBack(t *testing.T) {
	clk := newClock()
	mem := newMem(t)
	rec := newRecorder(mem)
	p := sliding(1000, 10*time.Second)
	s := newEscrow(t, rec, clk, Options{Lease: 500 * time.Millisecond, Threshold: 20})
	it := item("a", p, 1)
	now := clk.Now()
	heat(t, s, now, it)
	s.Tick(context.Background())
	lease := held(s, now, it)
	if lease < 1 {
		t.Fatalf("no lease after a tick")
	}
	callsBefore, _, _ := rec.stats(nil)
	granted := int64(0)
	for range lease {
		if d := decide(t, s, now, it); !d[0].OK {
			t.Fatalf("a hit of the lease was rejected: %+v", d[0])
		}
		granted++
	}
	if calls, _, _ := rec.stats(nil); calls != callsBefore {
		t.Fatalf("%d calls to the shared store for %d hits granted from the lease, want 0", calls-callsBefore, lease)
	}
	// The lease is spent: the next request goes to the shared store.
	if d := decide(t, s, now, it); !d[0].OK {
		t.Fatalf("a hit past the lease: %+v", d[0])
	}
	granted++
	if calls, _, _ := rec.stats(nil); calls != callsBefore+1 {
		t.Fatalf("%d calls for a hit past the lease, want 1", calls-callsBefore)
	}
	// A second lease, half used, then ended: the unused half comes back.
	s.Tick(context.Background())
	second := held(s, now, it)
	for range second / 2 {
		decide(t, s, now, it)
		granted++
	}
	clk.Add(500 * time.Millisecond)
	s.Tick(context.Background())
	if got, want := s.Stats().GivenBack, uint64(second-second/2); got != want {
		t.Fatalf("given back %d hits, want %d (the unused part of the second lease)", got, want)
	}
	s.Close() // gives back the lease the last tick took, unused
	_, _, remote := rec.stats(nil)
	if local := granted - remote; rec.held(nil) != local {
		t.Fatalf("the leases kept %d hits, %d were granted from them", rec.held(nil), local)
	}
	if got := count(t, mem, clk.Now(), it); got != granted {
		t.Fatalf("the shared store counts %d hits, %d were granted", got, granted)
	}
}

// TestAllOrNothing: a request with a leased pair and a pair on the shared
// store is one request: when the shared store rejects its part, the hits
// taken from the lease are put back; a local rejection in a request with
// no other part rejects it whole.
func TestAllOrNothing(t *testing.T) {
	clk := newClock()
	mem := newMem(t)
	p := sliding(1000, 10*time.Second)
	full := sliding(1, 10*time.Second)
	s := newEscrow(t, mem, clk, Options{Lease: 500 * time.Millisecond, Threshold: 20})
	hot, cold := item("hot", p, 1), item("cold", full, 1)
	now := clk.Now()
	heat(t, s, now, hot)
	s.Tick(context.Background())
	before := held(s, now, hot)
	if before < 2 {
		t.Fatalf("lease of %d hits, want 2 or more", before)
	}
	d := decide(t, s, now, hot, cold)
	if !d[0].OK || !d[1].OK {
		t.Fatalf("both granted first: %+v", d)
	}
	d = decide(t, s, now, hot, cold)
	if d[1].OK || !d[0].OK || d[0].Granted != 1 {
		t.Fatalf("cold over its limit: got %+v, want hot's answer granted (predicted) and cold rejected", d)
	}
	if got := held(s, now, hot); got != before-1 {
		t.Fatalf("the lease holds %d after a rejected request, want %d (its take put back)", got, before-1)
	}
	// Shadow: the cold part's rejection does not stop the lease's take.
	sh := cold
	sh.Shadow = true
	decide(t, s, now, hot, sh)
	if got := held(s, now, hot); got != before-2 {
		t.Fatalf("the lease holds %d after a request with a shadow rejection, want %d", got, before-2)
	}
	// The same pair twice in one request asks for the sum.
	two := hot
	two.Hits, two.Min = 2, 2
	left := held(s, now, hot)
	ask := make([]store.Item, 0, 2)
	ask = append(ask, two, hot)
	d = decide(t, s, now, ask...)
	if !d[0].OK || d[0].Granted != 2 || d[1].Granted != 1 || held(s, now, hot) != left-3 {
		t.Fatalf("a group of 2+1 hits: %+v, the lease holds %d of %d", d, held(s, now, hot), left)
	}
}

// TestRemoteFailurePutsBack: when the shared store fails the request's
// other part, the lease's take is put back and the error returned.
func TestRemoteFailurePutsBack(t *testing.T) {
	clk := newClock()
	mem := newMem(t)
	f := &failing{Leaser: mem}
	p := sliding(1000, 10*time.Second)
	s, err := New(Options{Remote: f, Leaser: mem, Default: true, Now: clk.Now, Lease: 500 * time.Millisecond, Threshold: 5, Size: SizeDemand})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	hot, cold := item("hot", p, 1), item("cold", p, 1)
	now := clk.Now()
	heat(t, s, now, hot)
	s.Tick(context.Background())
	before := held(s, now, hot)
	f.fail = true
	out := make([]tiers.Decision, 2)
	if err := s.Decide(context.Background(), now, []store.Item{hot, cold}, out); !errors.Is(err, errDown) {
		t.Fatalf("got %v, want the shared store's error", err)
	}
	if got := held(s, now, hot); got != before {
		t.Fatalf("the lease holds %d after a failed request, want %d", got, before)
	}
	// A request of the leased pair alone is decided without the shared
	// store.
	if d := decide(t, s, now, hot); !d[0].OK {
		t.Fatalf("a leased hit while the shared store fails: %+v", d[0])
	}
}

var errDown = errors.New("down")

// failing fails Decide while fail is set.
type failing struct {
	Leaser
	fail bool
}

func (f *failing) Decide(ctx context.Context, now time.Time, items []store.Item, out []tiers.Decision) error {
	if f.fail {
		return errDown
	}
	return f.Leaser.Decide(ctx, now, items, out)
}

// TestRefusedRejectsLocally: a full pair's lease is refused; its requests
// are rejected without a call, with the shared store's wait, for at most
// one lease length, and a lease is granted again once the window frees.
func TestRefusedRejectsLocally(t *testing.T) {
	clk := newClock()
	mem := newMem(t)
	rec := newRecorder(mem)
	p := sliding(10, 10*time.Second)
	s := newEscrow(t, rec, clk, Options{Lease: time.Second, Threshold: 5})
	it := item("a", p, 1)
	t0 := clk.Now()
	for range 10 {
		decide(t, mem, t0, it)
	}
	now := clk.Add(2 * time.Second)
	heat(t, s, now, it)
	s.Tick(context.Background())
	if st := s.Stats(); st.Refused != 1 || st.Leases != 0 {
		t.Fatalf("stats %+v: want the lease refused", st)
	}
	calls, _, _ := rec.stats(nil)
	d := decide(t, s, now, it)
	if d[0].OK {
		t.Fatalf("granted a hit of a full pair: %+v", d[0])
	}
	// The store's wait: the hits of 0s leave the window at 10s, 8s from now.
	if want := 8 * time.Second; d[0].RetryAfter != want {
		t.Fatalf("retry after %v, want %v", d[0].RetryAfter, want)
	}
	if got, _, _ := rec.stats(nil); got != calls {
		t.Fatalf("%d calls for a local rejection, want 0", got-calls)
	}
	chk := it
	chk.Hits, chk.Min = 0, 0
	if d := decide(t, s, now, chk); !d[0].OK {
		t.Fatalf("a check of a full pair: %+v, want OK (a check takes nothing)", d[0])
	}
	calls++ // the check went to the shared store
	// After one lease length the shared store decides again.
	now = clk.Add(time.Second)
	decide(t, s, now, it)
	if got, _, _ := rec.stats(nil); got != calls+1 {
		t.Fatalf("%d calls a lease length after the refusal, want 1", got-calls)
	}
	// Once the window has freed, a lease.
	now = clk.Add(8 * time.Second)
	heat(t, s, now, it) // keep it hot
	s.Tick(context.Background())
	if got := held(s, now, it); got < 1 {
		t.Fatalf("no lease once the window freed (stats %+v)", s.Stats())
	}
}

// TestCoolsOut: a pair whose rate falls leaves escrow, its lease given
// back.
func TestCoolsOut(t *testing.T) {
	clk := newClock()
	mem := newMem(t)
	p := sliding(1000, 10*time.Second)
	s := newEscrow(t, mem, clk, Options{Lease: 200 * time.Millisecond, Threshold: 20})
	it := item("a", p, 1)
	heat(t, s, clk.Now(), it)
	s.Tick(context.Background())
	if held(s, clk.Now(), it) == 0 {
		t.Fatal("no lease")
	}
	for range 20 {
		clk.Add(200 * time.Millisecond)
		s.Tick(context.Background())
	}
	if _, ok := s.entries.Load(it.Key); ok {
		t.Fatalf("still in escrow after 4s without a decision")
	}
	st := s.Stats()
	if st.Left != 1 || st.Keys != 0 {
		t.Fatalf("stats %+v: want the pair out of escrow", st)
	}
	if got := count(t, mem, clk.Now(), it); got != 0 {
		t.Fatalf("the shared store counts %d hits, none was granted", got)
	}
}

// TestNewPolicyRetiresLeases: a request under a new policy for a pair
// (a reload) goes to the shared store, and the next tick gives back the
// old policy's leases and leases under the new one.
func TestNewPolicyRetiresLeases(t *testing.T) {
	clk := newClock()
	mem := newMem(t)
	old, neu := sliding(1000, 10*time.Second), sliding(10, 10*time.Second)
	s := newEscrow(t, mem, clk, Options{Lease: 500 * time.Millisecond, Threshold: 20})
	it := item("a", old, 1)
	heat(t, s, clk.Now(), it)
	s.Tick(context.Background())
	if held(s, clk.Now(), it) <= 10 {
		t.Fatal("want a lease of more than 10 hits")
	}
	it.Policy = neu
	decide(t, s, clk.Now(), it)
	s.Tick(context.Background())
	v, _ := s.entries.Load(it.Key)
	e := v.(*entry)
	if e.pol.Load() != neu {
		t.Fatalf("the pair leases under the old policy after a tick")
	}
	for range 20 {
		decide(t, s, clk.Now(), it)
	}
	if got := count(t, mem, clk.Now(), it); got > 10 {
		t.Fatalf("the shared store counts %d hits under a limit of 10", got)
	}
}

// TestClose: Close gives back what the leases hold, and Decide fails
// after it.
func TestClose(t *testing.T) {
	clk := newClock()
	mem := newMem(t)
	p := sliding(1000, 10*time.Second)
	s := newEscrow(t, mem, clk, Options{Lease: 500 * time.Millisecond, Threshold: 20})
	it := item("a", p, 1)
	heat(t, s, clk.Now(), it)
	s.Tick(context.Background())
	decide(t, s, clk.Now(), it)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if got := count(t, mem, clk.Now(), it); got != 1 {
		t.Fatalf("the shared store counts %d hits after Close, want the 1 granted", got)
	}
	out := make([]tiers.Decision, 1)
	if err := s.Decide(context.Background(), clk.Now(), []store.Item{it}, out); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("got %v after Close, want ErrClosed", err)
	}
}

// TestNotLeased: what stays on the shared store.
func TestNotLeased(t *testing.T) {
	clk := newClock()
	mem := newMem(t)
	bucket := &tiers.Policy{Kind: tiers.KindTokenBucket, Bucket: tiers.TokenBucket{Capacity: 100, Refill: 10, Per: time.Second}}
	short := sliding(100, 5*time.Millisecond) // under 10 of the shortest leases
	for _, tc := range []struct {
		name string
		it   store.Item
		opts Options
	}{
		{"a token bucket", item("b", bucket, 1), Options{}},
		{"a window under ten leases", item("s", short, 1), Options{}},
		{"escrow off", item("o", sliding(1000, time.Minute), 1), Options{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.Lease, tc.opts.Threshold = 500*time.Millisecond, 5
			s := newEscrow(t, mem, clk, tc.opts)
			if tc.name == "escrow off" {
				s.def = false
			}
			for range 20 {
				decide(t, s, clk.Now(), tc.it)
			}
			s.Tick(context.Background())
			if got := s.Stats(); got.Keys != 0 || got.Leases != 0 {
				t.Fatalf("stats %+v: want nothing leased", got)
			}
		})
	}
}

// TestDecisionFields: a decision from a lease reports the lease's view.
func TestDecisionFields(t *testing.T) {
	clk := newClock()
	mem := newMem(t)
	p := sliding(1000, 10*time.Second)
	p.HardLimit = 500
	s := newEscrow(t, mem, clk, Options{Lease: 100 * time.Millisecond, Threshold: 20})
	it := item("a", p, 1)
	heat(t, s, clk.Now(), it)
	s.Tick(context.Background())
	n := held(s, clk.Now(), it)
	now := clk.Add(10 * time.Millisecond)
	got := decide(t, s, now, it)[0]
	want := tiers.Decision{OK: true, Granted: 1, HardLimit: 500, Tier: 1, TierLimit: 1000, TierWindow: 10 * time.Second,
		TierHits: 1000 - (n - 1), Remaining: n - 1, ResetAfter: 40 * time.Millisecond, // the hard limit's second: leases of 50ms
		Leased: true}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("decision (-want +got):\n%s", diff)
	}
}

// TestDecisionsMarkedLeased: the decisions made from leases are marked
// Leased (the decision log's "escrow": "local"), and only those: a grant
// from a lease, a local rejection of a pair whose lease was refused, a
// request's group its leases hold beside one on the shared store; not a
// decision of the shared store (a cold pair, a leased pair past its
// lease, a locally rejected group that the shared store decided again in a
// request that went to it anyway).
func TestDecisionsMarkedLeased(t *testing.T) {
	clk := newClock()
	mem := newMem(t)
	s := newEscrow(t, mem, clk, Options{Lease: time.Second, Threshold: 5})
	hot, cold := item("hot", sliding(1000, 10*time.Second), 1), item("cold", sliding(1000, 10*time.Second), 1)
	full := item("full", sliding(10, 10*time.Second), 1)
	t0 := clk.Now()
	for range 10 {
		decide(t, mem, t0, full)
	}
	now := clk.Add(2 * time.Second)
	heat(t, s, now, hot)
	heat(t, s, now, full)
	s.Tick(context.Background())
	if held(s, now, hot) < 2 || s.Stats().Refused != 1 {
		t.Fatalf("want a lease of hot and full's refused (stats %+v)", s.Stats())
	}
	leased := func(out []tiers.Decision) []bool {
		var b []bool
		for _, d := range out {
			b = append(b, d.Leased)
		}
		return b
	}
	for _, tc := range []struct {
		name  string
		items []store.Item
		want  []bool
		ok    bool
	}{
		{"a grant from a lease", []store.Item{hot}, []bool{true}, true},
		{"a cold pair", []store.Item{cold}, []bool{false}, true},
		{"a lease beside the shared store", []store.Item{hot, cold}, []bool{true, false}, true},
		{"a refused pair rejected locally", []store.Item{full}, []bool{true}, false},
		{"a refused pair in a request to the shared store", []store.Item{full, cold}, []bool{false, false}, false},
	} {
		out := decide(t, s, now, tc.items...)
		if diff := cmp.Diff(tc.want, leased(out)); diff != "" || out[0].OK != tc.ok {
			t.Errorf("%s: first OK %v, want %v; Leased (-want +got):\n%s", tc.name, out[0].OK, tc.ok, diff)
		}
	}
	// Past the lease: the shared store decides, unmarked.
	for range held(s, now, hot) {
		decide(t, s, now, hot)
	}
	if out := decide(t, s, now, hot); !out[0].OK || out[0].Leased {
		t.Errorf("a hit past the lease: %+v, want granted by the shared store, not Leased", out[0])
	}
}

// TestLeaseLength: a pair's leases last a twentieth of its shortest window, up
// to the longest lease.
func TestLeaseLength(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    func() *tiers.Policy
		want time.Duration
	}{
		{"a minute", func() *tiers.Policy { return sliding(1000, time.Minute) }, time.Second},
		{"a second", func() *tiers.Policy { return sliding(1000, time.Second) }, 50 * time.Millisecond},
		{"a minute with a hard limit", func() *tiers.Policy { p := sliding(1000, time.Minute); p.HardLimit = 100; return p }, 50 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newClock()
			s := newEscrow(t, newMem(t), clk, Options{Threshold: 5})
			it := item("a", tc.p(), 1)
			heat(t, s, clk.Now(), it)
			s.Tick(context.Background())
			v, _ := s.entries.Load(it.Key)
			e := v.(*entry)
			e.mu.Lock()
			defer e.mu.Unlock()
			if e.leases[0] == nil || e.leases[0].until != clk.Now().Add(tc.want) {
				t.Fatalf("lease %+v, want one until now+%v", e.leases[0], tc.want)
			}
		})
	}
}

// TestLocalDecisionAllocs: a request of one leased pair, granted from the
// lease, allocates nothing.
func TestLocalDecisionAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	clk := newClock()
	s := newEscrow(t, newMem(t), clk, Options{Threshold: 5})
	it := []store.Item{item("a", sliding(1<<40, time.Minute), 1)}
	heat(t, s, clk.Now(), it[0])
	s.Tick(context.Background())
	out := make([]tiers.Decision, 1)
	now := clk.Now()
	n := held(s, now, it[0])
	if n < 2 {
		t.Fatalf("a lease of %d hits", n)
	}
	before := s.Stats().LocalGranted
	allocs := testing.AllocsPerRun(int(n-1), func() {
		if err := s.Decide(context.Background(), now, it, out); err != nil || !out[0].OK {
			t.Fatal(err, out[0])
		}
	})
	if got := s.Stats().LocalGranted - before; allocs != 0 || got != uint64(n) {
		t.Errorf("%v allocations, %d local grants of %d; want 0 and all", allocs, got, n)
	}
}

// slowLeaser is a Leaser whose calls take d on the test's clock: a store
// far away.
type slowLeaser struct {
	Leaser
	clk *clock
	d   time.Duration
}

func (l slowLeaser) Reserve(ctx context.Context, now time.Time, after time.Duration, items []store.Item, out []tiers.Decision) (time.Time, error) {
	at, err := l.Leaser.Reserve(ctx, now, after, items, out)
	l.clk.Add(l.d / 2)
	return at, err
}

func (l slowLeaser) Decide(ctx context.Context, now time.Time, items []store.Item, out []tiers.Decision) error {
	err := l.Leaser.Decide(ctx, l.clk.Now(), items, out)
	l.clk.Add(l.d / 2)
	return err
}

// TestLateLeaseGivenBack: a lease whose calls take longer than its length
// arrives ended; its hits go back at once (they would only hold the
// budget), and the next lease lasts three times the calls, so the pair is
// then decided from leases.
func TestLateLeaseGivenBack(t *testing.T) {
	clk := newClock()
	mem := newMem(t)
	far := slowLeaser{Leaser: mem, clk: clk, d: 80 * time.Millisecond}
	// A per-second limit: leases of 50ms, shorter than the 80ms calls.
	s := newEscrow(t, mem, clk, Options{Leaser: far, Threshold: 3, Size: SizeDemand})
	it := item("far", sliding(100_000, time.Second), 1)
	ctx := context.Background()
	for i := 0; s.Stats().LocalGranted == 0; i++ {
		if i > 5000 {
			t.Fatalf("never decided from a lease: %+v", s.Stats())
		}
		decide(t, s, clk.Add(time.Millisecond), it)
		s.Tick(ctx)
	}
	st := s.Stats()
	if st.Late == 0 {
		t.Fatalf("no lease arrived ended: %+v", st)
	}
	// What the late leases held went back: the memory store counts only
	// what was granted and what live leases hold.
	s.Close()
	if got, granted := count(t, mem, clk.Now(), it), int64(st.LocalGranted+st.Remote); got != granted {
		t.Errorf("the store counts %d hits, %d were granted: late leases were not given back", got, granted)
	}
}
