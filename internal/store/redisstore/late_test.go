package redisstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/charonlimit/charon/internal/redisconn"
	"github.com/charonlimit/charon/internal/redistest"
	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/storetest"
	"github.com/charonlimit/charon/tiers"
)

// TestLateGrantGivenBack: a call that Redis applies after its caller gave
// up (Redis pauses writes past the caller's deadline) is given back when
// its reply comes, so Redis counts no hit the caller was not told of: the
// pair holds none afterwards, and its whole limit is granted.
func TestLateGrantGivenBack(t *testing.T) {
	n := redistest.Single(t)
	s := openStore(t, redisconn.Options{URL: "redis://" + n.Addr()}, Options{Clock: ClockCaller})
	now := time.Now()
	out := make([]tiers.Decision, 1)
	release := lateCall(t, s, now)
	unsettled(t, s, "the late call is in flight")
	release()
	waitLateGrants(t, s, 1)
	it := item(lyft, "r", "late", 1)
	v, err := s.Inspect(context.Background(), now, &it)
	if err != nil {
		t.Fatal(err)
	}
	if h := v.Tiers[0].Hits; h != 0 {
		t.Errorf("the pair holds %d hits after the late grant was given back, want 0", h)
	}
	all := item(lyft, "r", "late", lyft.Tiers[0].Limit)
	if err := s.Decide(context.Background(), now, []store.Item{all}, out); err != nil || !out[0].OK || out[0].Granted != lyft.Tiers[0].Limit {
		t.Errorf("the whole limit after the give-back: %v %+v", err, out[0])
	}
}

// holdRefund is a hook that holds the second pipeline naming a key that
// contains key (the first is the late call itself, the second its refund)
// until release is closed, and signals held when it does.
type holdRefund struct {
	key     string
	seen    atomic.Int32
	held    chan struct{}
	release chan struct{}
}

func (h *holdRefund) hook() *redistest.Hook {
	return &redistest.Hook{Pipeline: func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
		for _, cmd := range cmds {
			if args := cmd.Args(); len(args) > 3 && strings.Contains(fmt.Sprint(args[3]), h.key) {
				if h.seen.Add(1) == 2 {
					close(h.held)
					<-h.release
				}
				break
			}
		}
		return next(ctx, cmds)
	}}
}

// TestRefundOffTheDispatcher: the refund of a late reply takes its own
// round trip, not the dispatcher's: while it is held up, the calls queued
// behind the late one are still sent and answered. A dispatcher that sent
// the refund itself would leave them queued until their deadline.
func TestRefundOffTheDispatcher(t *testing.T) {
	n := redistest.Single(t)
	c := redis.NewClient(&redis.Options{Addr: n.Addr()})
	defer c.Close()
	h := &holdRefund{key: "late", held: make(chan struct{}), release: make(chan struct{})}
	c.AddHook(h.hook())
	s, err := NewWithClient(c, Options{Clock: ClockCaller})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Now()
	out := make([]tiers.Decision, 1)
	lateCall(t, s, now)()
	select {
	case <-h.held:
	case <-time.After(30 * time.Second):
		t.Fatal("the late call's refund was never sent")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	err = s.Decide(ctx, now, []store.Item{item(lyft, "r", "next", 1)}, out)
	cancel()
	if err != nil || !out[0].OK {
		t.Errorf("a call queued while the refund was held up: %v %+v; want it answered", err, out[0])
	}
	unsettled(t, s, "the late call's refund is held")
	if got := s.Replies(); got < 3 {
		t.Errorf("Replies() = %d, want at least 3 (warm-up, the late call, the next one)", got)
	}
	close(h.release)
	waitLateGrants(t, s, 1)
}

// lateCall loads the function, then makes a call of 3 hits on pair
// (r, late) whose caller gives up once the call was sent, its pipeline held
// by a gate: Redis applies it only when the returned release is called, and
// its reply comes after its caller has gone.
func lateCall(t *testing.T, s *Store, now time.Time) (release func()) {
	t.Helper()
	return lateCallOf(t, s, now, item(lyft, "r", "late", 3))
}

// lateCallOf is lateCall of a call of items.
func lateCallOf(t *testing.T, s *Store, now time.Time, items ...store.Item) (release func()) {
	t.Helper()
	return lateOf(t, s, now, func(ctx context.Context) error {
		return s.Decide(ctx, now, items, make([]tiers.Decision, len(items)))
	})
}

// lateOf is lateCall of the call that call makes on ctx (a Decide, a
// Reserve, a GiveBack).
func lateOf(t *testing.T, s *Store, now time.Time, call func(ctx context.Context) error) (release func()) {
	t.Helper()
	out := make([]tiers.Decision, 1)
	if err := s.Decide(context.Background(), now, []store.Item{item(lyft, "r", "warm", 1)}, out); err != nil || !out[0].OK {
		t.Fatalf("warm-up: %v %+v", err, out[0])
	}
	var g gate
	s.c.AddHook(g.hook())
	g.arm()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- call(ctx)
	}()
	select {
	case <-g.entered: // sent: its pipeline is held
	case <-time.After(20 * time.Second):
		t.Fatal("the late call was never sent")
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) || errors.Is(err, store.ErrNotSent) {
		t.Fatalf("the late call's caller: %v, want context.Canceled after it was sent", err)
	}
	var once sync.Once
	release = func() { once.Do(func() { close(g.release) }) }
	t.Cleanup(release)
	return release
}

// waitLateGrants waits until s has settled (Settle: the late reply read,
// its refund sent) and wants given late grants given back and none failed.
func waitLateGrants(t *testing.T, s *Store, given uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Settle(ctx); err != nil {
		t.Fatalf("Settle: %v", err)
	}
	if g, failed := s.LateGrants(); g != given || failed != 0 {
		t.Fatalf("late grants given back %d, failed %d once settled; want %d and 0", g, failed, given)
	}
}

// unsettled fails the test when s has nothing pending: Settle with a
// context already done must return its error.
func unsettled(t *testing.T, s *Store, what string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Settle(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Settle while %s: %v, want the context's error (something is pending)", what, err)
	}
}

// closingStore returns a store on its own Redis, on the caller's clock,
// that the test closes, and its client, which stays open until the test
// ends.
func closingStore(t *testing.T) (*redis.Client, *Store) {
	t.Helper()
	n := redistest.Single(t)
	c := redis.NewClient(&redis.Options{Addr: n.Addr()})
	t.Cleanup(func() { c.Close() })
	s, err := NewWithClient(c, Options{Clock: ClockCaller})
	if err != nil {
		t.Fatal(err)
	}
	return c, s
}

// TestLateRefundAtClose: a late reply read while the store closes (its
// dispatcher still waiting for its batch) is given back all the same, on a
// client the caller keeps.
func TestLateRefundAtClose(t *testing.T) {
	c, s := closingStore(t)
	now := time.Now()
	release := lateCall(t, s, now) // its caller has given up
	closed := make(chan struct{})
	go func() {
		s.Close()
		close(closed)
	}()
	<-s.stop  // Close has begun: the refunder is told to stop
	release() // now the dispatcher reads the late reply
	<-closed
	if given, failed := s.LateGrants(); given != 1 || failed != 0 {
		t.Errorf("after Close: late grants given back %d, failed %d; want 1 and 0", given, failed)
	}
	s2, err := NewWithClient(c, Options{Clock: ClockCaller})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	it := item(lyft, "r", "late", 1)
	v, err := s2.Inspect(context.Background(), now, &it)
	if err != nil {
		t.Fatal(err)
	}
	if h := v.Tiers[0].Hits; h != 0 {
		t.Errorf("the pair holds %d hits of the late call, want 0", h)
	}
}

// TestGrantGivenBackAtClose: a call waiting for its reply when the store
// closes answers store.ErrClosed, and its grant, which its caller was
// never told of, is given back before Close returns, as a late call's.
func TestGrantGivenBackAtClose(t *testing.T) {
	c, s := closingStore(t)
	now := storetest.T0
	storetest.Decide(t, s, now, item(lyft, "r", "warm", 1))
	var g gate
	c.AddHook(g.hook())
	g.arm()
	done := make(chan error, 1)
	go func() {
		done <- s.Decide(context.Background(), now, []store.Item{item(lyft, "r", "closed", 3)}, make([]tiers.Decision, 1))
	}()
	<-g.entered // sent, its pipeline held
	closed := make(chan struct{})
	go func() {
		s.Close()
		close(closed)
	}()
	if err := <-done; !errors.Is(err, store.ErrClosed) {
		t.Errorf("the call in flight at Close: %v, want store.ErrClosed", err)
	}
	close(g.release)
	<-closed
	if given, failed := s.LateGrants(); given != 1 || failed != 0 {
		t.Errorf("after Close: grants given back %d, failed %d; want 1 and 0", given, failed)
	}
	s2 := testStore(t, c, Options{Clock: ClockCaller, KeyPrefix: s.prefix})
	it := item(lyft, "r", "closed", 1)
	if h := hitsOf(t, s2, it); h != 0 {
		t.Errorf("the pair holds %d hits of the call, want 0", h)
	}
}

// f64s2 reads b as doubles, for messages.
func f64s2(b []byte) []int64 {
	v := make([]int64, len(b)/8)
	for i := range v {
		v[i] = f64at(b, i)
	}
	return v
}

// lateRig is a store on its own Redis, on clock, whose client
// holds the give-back of a late call on a pair whose domain holds "late"
// (the second pipeline naming its key: the first is the call itself)
// until the test has made its other calls, and counts the modes of the
// FCALLs sent in pipelines on such keys.
type lateRig struct {
	s     *Store
	h     *holdRefund
	give  func()
	mu    sync.Mutex
	modes map[int64]int
}

func newLateRig(t *testing.T, clock Clock) *lateRig {
	t.Helper()
	n := redistest.Single(t)
	c := redis.NewClient(&redis.Options{Addr: n.Addr()})
	t.Cleanup(func() { c.Close() })
	return newLateRigOn(t, c, clock)
}

// newLateRigOn is newLateRig on the client c (a Cluster's, say).
func newLateRigOn(t *testing.T, c redis.UniversalClient, clock Clock) *lateRig {
	t.Helper()
	r := &lateRig{h: &holdRefund{key: "late", held: make(chan struct{}), release: make(chan struct{})}, modes: map[int64]int{}}
	c.AddHook(r.h.hook())
	c.AddHook((&fcallHook{before: func(m int64, k string) {
		if strings.Contains(k, "late") {
			r.mu.Lock()
			r.modes[m]++
			r.mu.Unlock()
		}
	}}).hook())
	s, err := NewWithClient(c, Options{Clock: clock, KeyPrefix: newPrefix()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	var once sync.Once
	r.give = func() { once.Do(func() { close(r.h.release) }) }
	t.Cleanup(r.give)
	r.s = s
	return r
}

// late makes a late call of items at now, runs meanwhile once its
// give-back is sent (and held: the calls meanwhile makes are applied
// between the late call and its give-back), then lets the give-back go and
// waits for it: it must be given back, not failed.
func (r *lateRig) late(t *testing.T, now time.Time, meanwhile func(), items ...store.Item) {
	t.Helper()
	r.lateOf(t, now, meanwhile, func(ctx context.Context) error {
		return r.s.Decide(ctx, now, items, make([]tiers.Decision, len(items)))
	})
}

// lateOf is late of the call that call makes on ctx.
func (r *lateRig) lateOf(t *testing.T, now time.Time, meanwhile func(), call func(ctx context.Context) error) {
	t.Helper()
	lateOf(t, r.s, now, call)()
	select {
	case <-r.h.held:
	case <-time.After(30 * time.Second):
		t.Fatal("the late call's give-back was never sent")
	}
	meanwhile()
	r.give()
	waitLateGrants(t, r.s, 1)
}

// seen returns the modes counted.
func (r *lateRig) seen() map[int64]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.modes)
}

var fixed10 = &tiers.Policy{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Limit: 10, Unit: tiers.UnitSecond}}

// TestLateUndoExact: a late call on a plain limit or a fixed window whose
// give-back comes after other calls on its pair were applied leaves the
// pair as if it had never been made: the same answers, at every instant
// after, as a pair that had only the other calls. A refund (tiers.Refund)
// would take back the other calls' hits, the newest, and leave the late
// call's: older hits of a sliding window, which leave it too early, or a
// fixed window's count of the window the others went in (the late call's
// was over).
func TestLateUndoExact(t *testing.T) {
	ms := time.Millisecond
	t0 := storetest.T0
	for _, tc := range []struct {
		name string
		p    *tiers.Policy
		// the late call's instant, the other calls' and the probes'
		late, other time.Time
		probes      []time.Time
	}{
		{
			name: "sliding", p: lyft, late: t0, other: t0.Add(100 * ms),
			probes: []time.Time{t0.Add(101 * ms), t0.Add(time.Second), t0.Add(time.Second + ms), t0.Add(1099 * ms), t0.Add(1100 * ms)},
		},
		{
			name: "fixed", p: fixed10, late: t0.Add(100 * ms), other: t0.Add(1200 * ms),
			probes: []time.Time{t0.Add(1201 * ms), t0.Add(1999 * ms), t0.Add(2000 * ms)},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newLateRig(t, ClockCaller)
			r.late(t, tc.late, func() {
				for _, dom := range []string{"late", "ref"} {
					if d := storetest.Decide(t, r.s, tc.other, item(tc.p, "r", dom, 1))[0]; !d.OK {
						t.Fatalf("%s's hit meanwhile: %+v", dom, d)
					}
				}
			}, item(tc.p, "r", "late", 3))
			if diff := cmp.Diff(map[int64]int{modeDecide: 2, modeUndo: 1}, r.seen()); diff != "" {
				t.Errorf("calls on the late pair by mode (-want +got):\n%s", diff)
			}
			for i, at := range tc.probes {
				probe := func(dom string) tiers.Decision {
					it := item(tc.p, "r", dom, 10)
					it.Min = 1
					return storetest.Decide(t, r.s, at, it)[0]
				}
				ref, got := probe("ref"), probe("late")
				if i == 0 && (!ref.OK || ref.Granted != 9) {
					t.Fatalf("the pair with the other hit alone: %+v, want 9 of 10 granted", ref)
				}
				if diff := cmp.Diff(ref, got); diff != "" {
					t.Errorf("at +%v: the late pair's answer differs from the pair without the late call (-without +late):\n%s", at.Sub(t0), diff)
				}
			}
		})
	}
}

// TestLateUndoReservedAhead: a fixed window's count that holds hits
// reserved in the next window (pacing) when a late call's give-back comes
// is a state, not a number; the undo takes the late call's hits from the
// count of its window and keeps the reservation, as a pair that never had
// the late call: the whole limit in the late call's window, the reserved
// hits counted in the next.
func TestLateUndoReservedAhead(t *testing.T) {
	t0 := storetest.T0
	ms := time.Millisecond
	r := newLateRig(t, ClockCaller)
	r.late(t, t0.Add(100*ms), func() {
		for _, dom := range []string{"late", "ref"} {
			out := make([]tiers.Decision, 1)
			if _, err := r.s.Reserve(context.Background(), t0.Add(110*ms), time.Second, []store.Item{item(fixed10, "r", dom, 2)}, out); err != nil || !out[0].OK {
				t.Fatalf("%s's reservation in the next window: %v %+v", dom, err, out[0])
			}
		}
	}, item(fixed10, "r", "late", 3))
	if diff := cmp.Diff(map[int64]int{modeDecide: 2, modeUndo: 1}, r.seen()); diff != "" {
		t.Errorf("calls on the late pair by mode (-want +got):\n%s", diff)
	}
	for i, at := range []time.Time{t0.Add(120 * ms), t0.Add(1500 * ms)} {
		probe := func(dom string) tiers.Decision {
			it := item(fixed10, "r", dom, 10)
			it.Min = 1
			return storetest.Decide(t, r.s, at, it)[0]
		}
		ref, got := probe("ref"), probe("late")
		if want := []int64{10, 8}[i]; ref.Granted != want {
			t.Errorf("at +%v the pair without the late call was granted %d, want %d", at.Sub(t0), ref.Granted, want)
		}
		if diff := cmp.Diff(ref, got); diff != "" {
			t.Errorf("at +%v: the late pair's answer differs from the pair without the late call (-without +late):\n%s", at.Sub(t0), diff)
		}
	}
}

// TestLateRefundNotUndoable: a late call with a take that cannot be given
// back exactly (a tier stack, a token bucket, a global limit, a post-paid
// limit), alone or beside a plain limit, is refunded (every item in the
// decide mode, as a refund), and its pairs hold no hit afterwards.
func TestLateRefundNotUndoable(t *testing.T) {
	bucket := &tiers.Policy{Kind: tiers.KindTokenBucket, Bucket: tiers.TokenBucket{Capacity: 10, Refill: 1, Per: time.Second}}
	postPaid := &tiers.Policy{Kind: tiers.KindTiers, Overdraft: true, Tiers: lyft.Tiers}
	for _, tc := range []struct {
		name  string
		items []store.Item
	}{
		{"tier stack", []store.Item{item(twoTier, "r", "late", 3)}},
		{"token bucket", []store.Item{item(bucket, "r", "late", 3)}},
		{"global limit", []store.Item{item(withGlobal, "r", "late", 3)}},
		{"post-paid", []store.Item{item(postPaid, "r", "late", 3)}},
		{"beside a plain limit", []store.Item{item(lyft, "r", "late-a", 2), item(twoTier, "r", "late-b", 3)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newLateRig(t, ClockCaller)
			r.late(t, storetest.T0, func() {}, tc.items...)
			if diff := cmp.Diff(map[int64]int{modeDecide: 2}, r.seen()); diff != "" {
				t.Errorf("calls on the late pair by mode (-want +got):\n%s", diff)
			}
			for _, it := range tc.items {
				v, err := r.s.Inspect(context.Background(), storetest.T0, &it)
				if err != nil {
					t.Fatal(err)
				}
				if len(v.Tiers) > 0 && v.Tiers[0].Hits != 0 {
					t.Errorf("%s holds %d hits after the refund, want 0", it.Key.Domain, v.Tiers[0].Hits)
				}
				if it.Policy.Kind == tiers.KindTokenBucket {
					if d := storetest.Decide(t, r.s, storetest.T0, item(bucket, "r", it.Key.Domain, 10))[0]; !d.OK {
						t.Errorf("the full bucket after the refund: %+v", d)
					}
				}
			}
		})
	}
}

// TestLateUndoRedisClock: on Redis's clock the undo of a late call goes at
// the instant Redis decided it (its reply's), with the hits of a call
// applied since kept: the pair then holds that call's hit alone.
func TestLateUndoRedisClock(t *testing.T) {
	// An hour's window: a busy machine's seconds do not empty it.
	hour := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 10, Window: time.Hour, Active: tiers.Unbounded}}}
	r := newLateRig(t, ClockRedis)
	r.late(t, time.Now(), func() {
		if d := storetest.Decide(t, r.s, time.Now(), item(hour, "r", "late", 1))[0]; !d.OK {
			t.Fatalf("the hit meanwhile: %+v", d)
		}
	}, item(hour, "r", "late", 3))
	if diff := cmp.Diff(map[int64]int{modeDecide: 2, modeUndo: 1}, r.seen()); diff != "" {
		t.Errorf("calls on the late pair by mode (-want +got):\n%s", diff)
	}
	it := item(hour, "r", "late", 9)
	if d := storetest.Decide(t, r.s, time.Now(), it)[0]; !d.OK || d.TierHits != 10 {
		t.Errorf("nine hits beside the one made meanwhile: %+v, want them granted, 10 in the window", d)
	}
}

// paceOp is a call of a late-reservation scenario on a pair: a Decide at
// at (after < 0) or a Reserve at at for at+after, of up to hits (at least
// 1).
type paceOp struct {
	at    time.Time
	after time.Duration
	hits  int64
}

// run makes op on the pair (r, dom) of policy p; it returns the instant
// reserved for and the decision.
func (op paceOp) run(t *testing.T, s *Store, p *tiers.Policy, dom string) (time.Time, tiers.Decision) {
	t.Helper()
	it := item(p, "r", dom, op.hits)
	it.Min = 1
	if op.after < 0 {
		return time.Time{}, storetest.Decide(t, s, op.at, it)[0]
	}
	out := make([]tiers.Decision, 1)
	at, err := s.Reserve(context.Background(), op.at, op.after, []store.Item{it}, out)
	if err != nil {
		t.Fatalf("Reserve at +%v for %v later on %s: %v", op.at.Sub(storetest.T0), op.after, dom, err)
	}
	return at, out[0]
}

// giveBackHeaders records, per pair domain ("late", "back"), the ARGV[1]
// of the last FCALL sent in a pipeline on its key that gives back a
// reservation (a negative offset after the plan).
type giveBackHeaders struct {
	mu   sync.Mutex
	hdrs map[string][]byte
}

func (g *giveBackHeaders) hook() *redistest.Hook {
	return &redistest.Hook{Pipeline: func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
		for _, cmd := range cmds {
			args := cmd.Args()
			if len(args) < 4 {
				continue
			}
			nk, ok := args[2].(int)
			if !ok || len(args) < 5+nk {
				continue
			}
			hdr, ok := args[3+nk].([]byte)
			if !ok || len(hdr) < 8*hdrFields {
				continue
			}
			plain := hdrFields + (itemFields+planFields)*int(f64at(hdr, 5))
			if len(hdr) != 8*(plain+1) || f64at(hdr, plain) >= 0 {
				continue
			}
			key := fmt.Sprint(args[3])
			g.mu.Lock()
			for _, dom := range []string{"late", "back"} {
				if strings.Contains(key, dom) {
					g.hdrs[dom] = slices.Clone(hdr)
				}
			}
			g.mu.Unlock()
		}
		return next(ctx, cmds)
	}}
}

// TestLateReservationGivenBack: a reservation (pacing) that Redis granted
// after its caller gave up is given back when its reply comes, as the
// engine gives back a wait its caller left (Store.GiveBack of
// store.Reserved, for the instant reserved: the reply's): the same FCALL
// byte for byte as a pair whose reservation was given back so, and then
// the same answers at every instant after; where that give-back is exact,
// the answers of a pair that never had the reservation. For one tier, a
// token bucket (exact alone; with a later reservation pending, its
// documented safe give-back) and a fixed window (the reservation in its
// window, in the next, and given back once the next began). Calls on the
// pairs come between the reservation and its give-back.
func TestLateReservationGivenBack(t *testing.T) {
	ms := time.Millisecond
	t0 := storetest.T0
	bucket := &tiers.Policy{Kind: tiers.KindTokenBucket, Bucket: tiers.TokenBucket{Capacity: 10, Refill: 10, Per: time.Second}}
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	now := func(d time.Duration, hits int64) paceOp { return paceOp{at(d), -1, hits} }
	for _, tc := range []struct {
		name string
		p    *tiers.Policy
		// before: on every pair before the late reservation; late: the
		// reservation (on "late", late, and on "back", given back);
		// meanwhile: on every pair between it and its give-back.
		before, meanwhile []paceOp
		late              paceOp
		probes            []time.Duration
		// exact: the late pair answers as "ref", which never had it.
		exact bool
	}{
		{
			name: "one tier", p: lyft,
			before:    []paceOp{now(0, 10)},
			late:      paceOp{at(100 * ms), 950 * ms, 3},
			meanwhile: []paceOp{{at(200 * ms), 900 * ms, 2}},
			probes:    []time.Duration{300 * ms, 1050 * ms, 1100 * ms, 1500 * ms, 2050 * ms, 2100 * ms, 2200 * ms},
			exact:     true,
		},
		{
			name: "token bucket", p: bucket,
			before:    []paceOp{now(0, 10)},
			late:      paceOp{at(10 * ms), 300 * ms, 3},
			meanwhile: []paceOp{now(20*ms, 1)},
			probes:    []time.Duration{100 * ms, 310 * ms, 400 * ms, time.Second, 2 * time.Second},
			exact:     true,
		},
		{
			name: "token bucket, a later reservation pending", p: bucket,
			before:    []paceOp{now(0, 10)},
			late:      paceOp{at(10 * ms), 300 * ms, 3},
			meanwhile: []paceOp{{at(20 * ms), 500 * ms, 2}},
			probes:    []time.Duration{100 * ms, 310 * ms, 520 * ms, 600 * ms, time.Second, 2 * time.Second},
		},
		{
			name: "fixed window", p: fixed10,
			late:      paceOp{at(100 * ms), 200 * ms, 3},
			meanwhile: []paceOp{now(150*ms, 1)},
			probes:    []time.Duration{400 * ms, 999 * ms, 1000 * ms},
			exact:     true,
		},
		{
			name: "fixed window, the next one", p: fixed10,
			before:    []paceOp{now(100*ms, 10)},
			late:      paceOp{at(200 * ms), 800 * ms, 3},
			meanwhile: []paceOp{{at(300 * ms), 700 * ms, 2}},
			probes:    []time.Duration{500 * ms, 1000 * ms, 1500 * ms, 2000 * ms},
			exact:     true,
		},
		{
			name: "fixed window, the next one begun", p: fixed10,
			before:    []paceOp{now(100*ms, 10)},
			late:      paceOp{at(200 * ms), 800 * ms, 3},
			meanwhile: []paceOp{now(1100*ms, 1)},
			probes:    []time.Duration{1200 * ms, 2000 * ms},
			exact:     true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newLateRig(t, ClockCaller)
			g := &giveBackHeaders{hdrs: map[string][]byte{}}
			r.s.c.AddHook(g.hook())
			pairs := []string{"late", "back", "ref"}
			// The function loaded (its first call is sent twice).
			storetest.Decide(t, r.s, t0, item(tc.p, "r", "warm", 1))
			for _, op := range tc.before {
				for _, dom := range pairs {
					op.run(t, r.s, tc.p, dom)
				}
			}
			// The rig holds the second pipeline on the late pair from here:
			// the first is the late reservation, the second its give-back.
			r.h.seen.Store(0)
			late := tc.late
			r.lateOf(t, late.at, func() {
				reserved, d := late.run(t, r.s, tc.p, "back")
				if !d.OK || d.Granted != late.hits {
					t.Fatalf("the reservation on the other pair: %+v, want %d granted", d, late.hits)
				}
				if want := late.at.Add(late.after); !reserved.Equal(want) {
					t.Fatalf("reserved for %v, want %v", reserved, want)
				}
				for _, op := range tc.meanwhile {
					for _, dom := range pairs {
						op.run(t, r.s, tc.p, dom)
					}
				}
				// The engine's give-back of a wait its caller left, at the
				// reservation's present.
				it := item(tc.p, "r", "back", late.hits)
				it.Min = 1
				back := store.Reserved([]store.Item{it}, []tiers.Decision{d})
				if err := r.s.GiveBack(context.Background(), late.at, reserved, back); err != nil {
					t.Fatalf("GiveBack: %v", err)
				}
			}, func(ctx context.Context) error {
				it := item(tc.p, "r", "late", late.hits)
				it.Min = 1
				_, err := r.s.Reserve(ctx, late.at, late.after, []store.Item{it}, make([]tiers.Decision, 1))
				return err
			})
			g.mu.Lock()
			lh, bh := g.hdrs["late"], g.hdrs["back"]
			g.mu.Unlock()
			if lh == nil || string(lh) != string(bh) {
				t.Errorf("the late reservation's give-back %v, want the engine's %v", f64s2(lh), f64s2(bh))
			}
			for _, d := range tc.probes {
				probe := func(dom string) tiers.Decision {
					it := item(tc.p, "r", dom, 10)
					it.Min = 1
					return storetest.Decide(t, r.s, at(d), it)[0]
				}
				ref, back, got := probe("ref"), probe("back"), probe("late")
				if diff := cmp.Diff(back, got); diff != "" {
					t.Errorf("at +%v: the late pair's answer differs from the pair given back by GiveBack (-back +late):\n%s", d, diff)
				}
				if diff := cmp.Diff(ref, got); tc.exact && diff != "" {
					t.Errorf("at +%v: the late pair's answer differs from the pair without the reservation (-without +late):\n%s", d, diff)
				}
			}
		})
	}
}

// TestLateReservationRedisClock: on Redis's clock a late reservation is
// given back at Redis's present, for the instant its reply answered (the
// master's then, plus the offset): the pair then holds none of its hits,
// and its whole limit is granted.
func TestLateReservationRedisClock(t *testing.T) {
	// An hour's window: a busy machine's seconds do not empty it.
	hour := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 10, Window: time.Hour, Active: tiers.Unbounded}}}
	n := redistest.Single(t)
	s := openStore(t, redisconn.Options{URL: "redis://" + n.Addr()}, Options{})
	release := lateOf(t, s, time.Now(), func(ctx context.Context) error {
		_, err := s.Reserve(ctx, time.Now(), 10*time.Second, []store.Item{item(hour, "r", "late", 3)}, make([]tiers.Decision, 1))
		return err
	})
	release()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Settle(ctx); err != nil {
		t.Fatalf("Settle: %v", err)
	}
	if d := storetest.Decide(t, s, time.Now(), item(hour, "r", "late", 10))[0]; !d.OK {
		t.Errorf("the whole limit once the late reservation was given back: %+v", d)
	}
	if given, failed := s.LateGrants(); given != 1 || failed != 0 {
		t.Errorf("late grants given back %d, failed %d; want 1 and 0", given, failed)
	}
}

// TestLateGiveBackApplied: a reservation's give-back whose caller gave up
// after it was sent was applied all the same when its reply comes: nothing
// more is sent (no late grant counted), and the pair answers as one that
// never had the reservation.
func TestLateGiveBackApplied(t *testing.T) {
	t0 := storetest.T0
	ms := time.Millisecond
	n := redistest.Single(t)
	s := openStore(t, redisconn.Options{URL: "redis://" + n.Addr()}, Options{Clock: ClockCaller})
	for _, dom := range []string{"late", "ref"} {
		storetest.Decide(t, s, t0, item(lyft, "r", dom, 10))
	}
	it := item(lyft, "r", "late", 3)
	out := make([]tiers.Decision, 1)
	at, err := s.Reserve(context.Background(), t0.Add(100*ms), 950*ms, []store.Item{it}, out)
	if err != nil || !out[0].OK {
		t.Fatalf("the reservation: %v %+v", err, out[0])
	}
	lateOf(t, s, t0.Add(100*ms), func(ctx context.Context) error {
		return s.GiveBack(ctx, t0.Add(100*ms), at, store.Reserved([]store.Item{it}, out))
	})()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Settle(ctx); err != nil {
		t.Fatalf("Settle: %v", err)
	}
	if given, failed := s.LateGrants(); given != 0 || failed != 0 {
		t.Errorf("late grants given back %d, failed %d; want none: the give-back was applied", given, failed)
	}
	for _, d := range []time.Duration{200 * ms, 1050 * ms, 1500 * ms, 2050 * ms} {
		probe := func(dom string) tiers.Decision {
			it := item(lyft, "r", dom, 10)
			it.Min = 1
			return storetest.Decide(t, s, t0.Add(d), it)[0]
		}
		ref, got := probe("ref"), probe("late")
		if diff := cmp.Diff(ref, got); diff != "" {
			t.Errorf("at +%v: the pair differs from one without the reservation (-without +given back):\n%s", d, diff)
		}
	}
}

// TestBackFor: the give-back of a call is made from what it sent and what
// Redis answered: the undo of each group's grant (summed over its members,
// entered or not) when every group given back can be undone, with the
// call's keys and policies that it names and no lock key; otherwise the
// refund of each item's grant at the call's instant, in the call's mode
// (lock keys kept), global keys included; a reservation's is the FCALL
// GiveBack makes of store.Reserved. Nothing for a call that was rejected,
// met a lock, is not a decision, holds nothing but refunds or was granted
// nothing; a refund beside a take stays, as applied. backRejected leaves
// the post-paid groups' debits, and passes newest to the undo.
func TestBackFor(t *testing.T) {
	s, err := NewWithClient(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), Options{Clock: ClockCaller, Pipelines: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	defer s.c.Close()
	t0 := storetest.T0
	at := t0.UnixMicro() + 500
	// sent is the FCALL call.command makes of items at t0 in mode with
	// offset off, and the encodings of its policies.
	sent := func(items []store.Item, mode int, off int64) ([]any, []*encoded) {
		c := s.calls.Get().(*call)
		defer s.put(c)
		c.prepare(s, items, t0)
		c.off = off
		c.command(s, items, -1, mode, t0.UnixMicro(), "")
		a := slices.Clone(c.args)
		a[3+len(c.keys)] = slices.Clone(c.hdr)
		return a, slices.Clone(c.pols)
	}
	// reply answers at, per item its flags and grant.
	reply := func(fg ...[2]int64) string {
		b := f64s(nil, statusDone, at)
		for _, x := range fg {
			b = f64s(b, x[0], x[1], 1, x[1], x[1], 0, 10-x[1], 0, 1000)
		}
		return string(b)
	}
	ok, burst := [2]int64{replyOK, 0}, [2]int64{replyOK | replyBurst, 0}
	g := func(f [2]int64, n int64) [2]int64 { return [2]int64{f[0], n} }
	key := func(it store.Item) string { k, _ := stateKey(s.prefix, &it); return k }
	gkey := func(it store.Item) string { _, k := stateKey(s.prefix, &it); return k }
	arg := func(p *tiers.Policy) any { return encodePolicy(p, t0).arg }
	postPaid := &tiers.Policy{Kind: tiers.KindTiers, Overdraft: true, Tiers: lyft.Tiers}
	refund := func(it store.Item) store.Item { it.Refund = true; return it }
	shadow := func(it store.Item) store.Item { it.Shadow = true; return it }
	a, a2, b := item(lyft, "r", "a", 2), item(lyft, "r", "a", 1), item(fixed10, "r", "b", 3)
	two, glob, pp := item(twoTier, "r", "t", 3), item(withGlobal, "r", "g", 2), item(postPaid, "r", "p", 3)
	// want is a give-back: its keys, header and policies.
	type want struct {
		keys []any
		h    header
		pols []any
	}
	undo := func(keys []any, pols []any, newest bool, items ...headerItem) *want {
		return &want{keys, header{mode: modeUndo, now: at, maxTTL: s.maxTTL, newest: newest, nk: len(keys), items: items}, pols}
	}
	refunds := func(mode int64, keys []any, nk int, pols []any, items ...headerItem) *want {
		return &want{keys, header{mode: mode, now: at, maxTTL: s.maxTTL, lease: s.lease, nk: nk, items: items}, pols}
	}
	for _, tc := range []struct {
		name   string
		items  []store.Item
		mode   int
		res    [][2]int64
		why    backWhy
		newest bool
		want   *want
	}{
		{name: "undo: a group of two and a fixed window", items: []store.Item{a, a2, b, item(lyft, "r", "c", 1)}, mode: modeDecide,
			res:  [][2]int64{g(burst, 2), g(burst, 1), g(ok, 3), g(ok, 0)},
			want: undo([]any{key(a), key(b)}, []any{arg(lyft), arg(fixed10)}, false, headerItem{key: 1, policy: 1, hits: 3, entered: true}, headerItem{key: 2, policy: 2, hits: 3})},
		{name: "undo of mode checked: no lock key", items: []store.Item{a}, mode: modeChecked, res: [][2]int64{g(ok, 2)},
			want: undo([]any{key(a)}, []any{arg(lyft)}, false, headerItem{key: 1, policy: 1, hits: 2})},
		{name: "refund: a tier stack beside a plain limit", items: []store.Item{a, two}, mode: modeDecide, res: [][2]int64{g(ok, 2), g(ok, 3)},
			want: refunds(modeDecide, []any{key(a), key(two)}, 2, []any{arg(lyft), arg(twoTier)},
				headerItem{key: 1, policy: 1, hits: 2, refund: true}, headerItem{key: 2, policy: 2, hits: 3, refund: true})},
		{name: "refund of mode checked: lock keys, global keys", items: []store.Item{glob}, mode: modeChecked, res: [][2]int64{g(ok, 1)},
			want: refunds(modeChecked, []any{key(glob), gkey(glob), lockKey(s.prefix, key(glob)), lockKey(s.prefix, gkey(glob))}, 2, []any{arg(withGlobal)},
				headerItem{key: 1, global: 2, policy: 1, hits: 1, refund: true})},
		{name: "a refund beside a take stays", items: []store.Item{refund(item(twoTier, "r", "x", 2)), b}, mode: modeDecide, res: [][2]int64{g(ok, 0), g(ok, 3)},
			want: undo([]any{key(b)}, []any{arg(fixed10)}, false, headerItem{key: 1, policy: 1, hits: 3})},
		{name: "a shadow item's refusal refuses nothing", items: []store.Item{a, shadow(b)}, mode: modeDecide, res: [][2]int64{g(ok, 2), {0, 0}},
			want: undo([]any{key(a)}, []any{arg(lyft)}, false, headerItem{key: 1, policy: 1, hits: 2})},
		{name: "late: post-paid refunded", items: []store.Item{a, pp}, mode: modeDecide, res: [][2]int64{g(ok, 2), g(ok, 3)},
			want: refunds(modeDecide, []any{key(a), key(pp)}, 2, []any{arg(lyft), arg(postPaid)},
				headerItem{key: 1, policy: 1, hits: 2, refund: true}, headerItem{key: 2, policy: 2, hits: 3, refund: true})},
		{name: "rejected: post-paid stays, newest", items: []store.Item{a, pp}, mode: modeChecked, res: [][2]int64{g(burst, 2), g(ok, 3)}, why: backRejected, newest: true,
			want: undo([]any{key(a)}, []any{arg(lyft)}, true, headerItem{key: 1, policy: 1, hits: 2, entered: true})},
		{name: "rejected call", items: []store.Item{a}, mode: modeDecide, res: [][2]int64{{0, 0}}},
		{name: "rejected call, another group granted", items: []store.Item{a, b}, mode: modeDecide, res: [][2]int64{g(ok, 2), {0, 0}}},
		{name: "rejected call, not undoable", items: []store.Item{two, a}, mode: modeDecide, res: [][2]int64{g(ok, 3), {0, 0}}},
		{name: "nothing granted", items: []store.Item{a}, mode: modeDecide, res: [][2]int64{g(ok, 0)}},
		{name: "a prepare", items: []store.Item{a}, mode: modePrepare, res: [][2]int64{g(ok, 2)}},
		{name: "holds refunds alone", items: []store.Item{refund(a)}, mode: modeDecide, res: [][2]int64{g(ok, 0)}},
	} {
		args, pols := sent(tc.items, tc.mode, 0)
		got := backFor(args, pols, reply(tc.res...), tc.why, tc.newest)
		if tc.want == nil {
			if got != nil {
				t.Errorf("%s: given back %v, want nothing", tc.name, got)
			}
			continue
		}
		if got == nil {
			t.Errorf("%s: nothing given back", tc.name)
			continue
		}
		nk := got[2].(int)
		h, err := parseHeader(got[3+nk].([]byte))
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		w := tc.want
		if diff := cmp.Diff(w.h, h, cmp.AllowUnexported(header{}, headerItem{})); diff != "" {
			t.Errorf("%s: header (-want +got):\n%s", tc.name, diff)
		}
		if diff := cmp.Diff(append(append(append([]any{fcallName, funcNameArg, len(w.keys)}, w.keys...), got[3+nk], ""), w.pols...), got); diff != "" {
			t.Errorf("%s: FCALL (-want +got):\n%s", tc.name, diff)
		}
	}
	if backFor(nil, nil, "", backLate, false) != nil {
		t.Error("given back a call of no command")
	}
	args, pols := sent([]store.Item{a}, modeChecked, 0)
	for name, res := range map[string]string{
		"busy":        string(f64s(nil, statusBusy, 0)),
		"short reply": string(f64s(nil, statusDone, at)),
	} {
		if got := backFor(args, pols, res, backLate, false); got != nil {
			t.Errorf("%s: given back %v", name, got)
		}
	}

	// A reservation is given back as the engine gives back a wait its
	// caller left: the FCALL GiveBack makes of store.Reserved, byte for
	// byte, for the instant it answered.
	items := []store.Item{item(lyft, "r", "d", 3), item(fixed10, "r", "e", 2)}
	args, pols = sent(items, modeDecide, 500)
	got := backFor(args, pols, reply(g(ok, 3), g(ok, 2)), backLate, false)
	back, _ := store.GiveBackItems(store.Reserved(items, []tiers.Decision{{OK: true, Granted: 3}, {OK: true, Granted: 2}}))
	if want, _ := sent(back, modeDecide, -at); !cmp.Equal(got, want) {
		t.Errorf("a reservation's give-back %v, want GiveBack's %v", got, want)
	}
	// That give-back, late too, holds nothing but refunds: applied.
	args, pols = sent(back, modeDecide, -at)
	if got := backFor(args, pols, reply(g(ok, 0), g(ok, 0)), backLate, false); got != nil {
		t.Errorf("a late give-back given back: %v", got)
	}
}

// TestLateRefundLockedRetried: on a Cluster, the refund of a late call
// (a tier stack: not undoable) that finds its key locked by another
// process's two-step call is sent again until the lock is gone, as Decide
// retries its own calls, and is counted given back, not failed; the pair
// then holds no hit.
func TestLateRefundLockedRetried(t *testing.T) {
	_, c := clusterClient(t)
	r := newLateRigOn(t, c, ClockCaller)
	it := item(twoTier, "r", "late", 3)
	sk, _ := stateKey(r.s.prefix, &it)
	r.late(t, storetest.T0, func() {
		// Another process's two-step call holds the key a little while.
		if err := c.Set(context.Background(), lockKey(r.s.prefix, sk), "someone", 300*time.Millisecond).Err(); err != nil {
			t.Fatal(err)
		}
	}, it)
	if n := r.seen()[modeChecked]; n < 3 {
		t.Errorf("%d calls in mode checked on the late pair, want at least 3: the call, its refund found locked, the refund again", n)
	}
	v, err := r.s.Inspect(context.Background(), storetest.T0, &it)
	if err != nil {
		t.Fatal(err)
	}
	if h := v.Tiers[0].Hits; h != 0 {
		t.Errorf("the pair holds %d hits after the refund, want 0", h)
	}
}

// TestLateCluster: on a Cluster, a call whose master holds it past its
// caller's deadline (its writes paused) is applied when the master resumes,
// after the caller gave up: what it granted is given back, for a decision,
// a reservation and a call spanning slots alike (whose other slot answered
// in time, or late in the same batch), and every pair then holds no hit.
func TestLateCluster(t *testing.T) {
	nodes, c := clusterClient(t)
	s := testStore(t, c, Options{Clock: ClockCaller})
	ctx := context.Background()
	if err := s.Load(ctx); err != nil {
		t.Fatal(err)
	}
	hour := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 10, Window: time.Hour, Active: tiers.Unbounded}}}
	now := storetest.T0
	// master returns the node serving it's slot.
	master := func(it store.Item) *redistest.Node {
		k, _ := stateKey(s.prefix, &it)
		return masterOf(t, nodes, k)
	}
	a := item(hour, "ra", "a", 3)
	var b store.Item
	for i := 0; ; i++ {
		if b = item(hour, "rb", fmt.Sprint("b", i), 2); master(b) != master(a) {
			break
		}
	}
	// late makes call with deadlines shorter than the pause of a's master,
	// from 20 ms doubling until the call was sent in time (not
	// store.ErrNotSent), then resumes the master and waits for the store
	// to settle (the late reply read, its grant given back).
	late := func(name string, call func(ctx context.Context) error) {
		t.Helper()
		resume := master(a).PauseWrites(t)
		for d := 20 * time.Millisecond; ; d *= 2 {
			ctx, cancel := context.WithTimeout(context.Background(), d)
			err := call(ctx)
			cancel()
			if errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, store.ErrNotSent) {
				break
			}
			if err == nil || d > 10*time.Second {
				t.Fatalf("%s: %v, want its deadline to pass after it was sent", name, err)
			}
		}
		resume()
		settle(t, s)
	}
	late("a decision", func(ctx context.Context) error {
		return s.Decide(ctx, now, []store.Item{a}, make([]tiers.Decision, 1))
	})
	late("a reservation", func(ctx context.Context) error {
		_, err := s.Reserve(ctx, now, time.Second, []store.Item{a}, make([]tiers.Decision, 1))
		return err
	})
	late("a call spanning slots", func(ctx context.Context) error {
		return s.Decide(ctx, now, []store.Item{a, b}, make([]tiers.Decision, 2))
	})
	given, failed := s.LateGrants()
	undone, undoFailed := s.Undone()
	if given < 3 || failed != 0 || undoFailed != 0 {
		t.Errorf("late grants given back %d (failed %d), slots given back %d (failed %d); want at least the 3 late calls' and no failure",
			given, failed, undone, undoFailed)
	}
	for _, it := range []store.Item{a, b} {
		if n := hitsOf(t, s, it); n != 0 {
			t.Errorf("%s holds %d hits, want none: every grant given back", it.Key.Domain, n)
		}
	}
	if lost := s.LateLost(); lost != 0 {
		t.Errorf("%d late replies lost, want none", lost)
	}
}
