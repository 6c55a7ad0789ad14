package escrow

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/tiers"
)

// link is a Leaser in front of the home as one region sees it: cut, every
// call fails (a dead link), and nothing reaches the home.
type link struct {
	Leaser
	cut   atomic.Bool
	calls atomic.Int64
}

var errCut = errors.New("the link to the home is cut")

func (l *link) Decide(ctx context.Context, now time.Time, items []store.Item, out []tiers.Decision) error {
	if l.cut.Load() {
		return errCut
	}
	l.calls.Add(1)
	return l.Leaser.Decide(ctx, now, items, out)
}

func (l *link) Reserve(ctx context.Context, now time.Time, after time.Duration, items []store.Item, out []tiers.Decision) (time.Time, error) {
	if l.cut.Load() {
		return time.Time{}, errCut
	}
	l.calls.Add(1)
	return l.Leaser.Reserve(ctx, now, after, items, out)
}

func (l *link) GiveBack(ctx context.Context, now, at time.Time, items []store.Item) error {
	if l.cut.Load() {
		return errCut
	}
	l.calls.Add(1)
	return l.Leaser.GiveBack(ctx, now, at, items)
}

// regionReplica is a replica of a region: its store and its Region.
type regionReplica struct {
	s      *Store
	r      *Region
	region int
	dead   bool
}

// regionTrace is a trace's settings.
type regionTrace struct {
	crashes, cuts bool
}

// runRegionTrace plays a random trace on two regions of two replicas each,
// every region with its own pool and link to one home (the memory store),
// on one clock: requests in bursts, ticks of stores and regions, clock
// steps and, as tr says, replicas crashing (dropped without Close: their
// sub-leases and the slices their Region opened stay counted) and links
// cut for a while. It checks that no window of any limit holds more
// answers than the limit; that sub-leases were taken (the trace left the
// home's path); and, with no crash and no cut, that once every store and
// region has closed the home counts exactly the hits answered: every
// slice and sub-lease gave back what it did not grant.
func runRegionTrace(t *testing.T, seed uint64, tr regionTrace) {
	rng := rand.New(rand.NewPCG(seed, seed^0x51ed27))
	clk := newClock()
	home := newMem(t)
	long := 30 * time.Second
	hard := sliding(400, long)
	hard.HardLimit = 60
	global := sliding(400, long)
	global.GlobalLimit = 80
	key := func(res, dom string, p *tiers.Policy) store.Item {
		return store.Item{Key: store.Key{Resource: res, Domain: dom, PolicyID: 1}, Policy: p}
	}
	rules := []traceRule{
		{key("a", "x", sliding(300, long)), true},
		{key("b", "x", sliding(80, time.Second)), true},
		{key("h", "x", hard), true},
		{key("g", "x", global), true},
		{key("g", "y", global), false},
		{key("big", "x", sliding(100_000, long)), true},
	}
	answers := make([][]answer, len(rules))
	const regions = 2
	links := make([]*link, regions)
	pools := make([]Pool, regions)
	for i := range links {
		links[i] = &link{Leaser: home}
		pools[i] = NewMemPool(clk.Now)
	}
	var all []*regionReplica
	newReplica := func(region int) *regionReplica {
		r, err := NewRegion(RegionOptions{Home: links[region], Pool: pools[region], Now: clk.Now, Lease: 400 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		s, err := New(Options{Remote: links[region], Leaser: r, Default: true, Now: clk.Now, Lease: 100 * time.Millisecond,
			Threshold: 3, Size: SizeDemand})
		if err != nil {
			t.Fatal(err)
		}
		rr := &regionReplica{s: s, r: r, region: region}
		all = append(all, rr)
		return rr
	}
	live := []*regionReplica{newReplica(0), newReplica(0), newReplica(1), newReplica(1)}
	ctx := context.Background()
	for range 4000 {
		r := live[rng.IntN(len(live))]
		switch x := rng.IntN(1000); {
		case x < 100:
			clk.Add(time.Duration(rng.IntN(21)) * time.Millisecond)
		case x < 200:
			r.s.Tick(ctx)
		case x < 260:
			r.r.Tick(ctx)
		case x < 262 && tr.crashes:
			r.dead = true
			i := slices.Index(live, r)
			live[i] = newReplica(r.region)
		case x < 264 && tr.cuts:
			l := links[r.region]
			l.cut.Store(!l.cut.Load())
		default:
			for range 1 + rng.IntN(8) {
				k := rng.IntN(len(rules))
				it := rules[k].it
				it.Hits = int64(1 + rng.IntN(3))
				it.Min = it.Hits
				now := clk.Now()
				out := make([]tiers.Decision, 1)
				if err := r.s.Decide(ctx, now, []store.Item{it}, out); err != nil {
					if errors.Is(err, errCut) {
						continue // the shared path, cut off: the failure mode's
					}
					t.Fatalf("seed %d: decide: %v", seed, err)
				}
				if out[0].OK {
					answers[k] = append(answers[k], answer{now, out[0].Granted})
				}
			}
		}
	}
	checkLimits(t, seed, rules, answers, global.GlobalLimit)

	var takes, local uint64
	for _, r := range all {
		takes += r.r.Stats().Takes
		local += r.s.Stats().LocalGranted
	}
	if takes == 0 || local == 0 {
		t.Fatalf("seed %d: %d sub-leases, %d requests granted from them: the trace never left the home's path", seed, takes, local)
	}
	for _, l := range links {
		l.cut.Store(false)
	}
	// Stores first (their sub-leases go back into the slices), then the
	// regions (the slices go back to the home).
	for _, r := range live {
		r.s.Close()
	}
	for _, r := range live {
		r.r.Close()
	}
	if tr.crashes || tr.cuts {
		return
	}
	for k, r := range rules {
		if r.it.Policy.Tiers[0].Window < long {
			continue
		}
		var answered int64
		for _, a := range answers[k] {
			answered += a.hits
		}
		if r.it.Policy.GlobalLimit > 0 {
			continue // counted with the other domain's: checked by the window
		}
		if got := count(t, home, clk.Now(), r.it); got != answered {
			t.Errorf("seed %d: %s: the home counts %d hits, %d were answered", seed, r.it.Key.Resource, got, answered)
		}
	}
}

// TestRegionTraces plays random traces of two regions leasing from one
// home: never over a limit, with crashes and cut links; every hit not
// granted given back exactly without them.
func TestRegionTraces(t *testing.T) {
	n := 20
	if testing.Short() {
		n = 5
	}
	for _, tr := range []regionTrace{{}, {crashes: true}, {cuts: true}, {crashes: true, cuts: true}} {
		for seed := range uint64(n) {
			runRegionTrace(t, seed, tr)
		}
	}
}

// TestRegionCutOff: a region whose link to the home is cut keeps granting
// from the slices it holds, without a call to the home, until they are
// spent or end;
// then its requests take the shared path, which fails (the failure mode's
// to answer), and no lease is taken from budget the home did not count.
func TestRegionCutOff(t *testing.T) {
	clk := newClock()
	home := newMem(t)
	l := &link{Leaser: home}
	r, err := NewRegion(RegionOptions{Home: l, Pool: NewMemPool(clk.Now), Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	s := newEscrow(t, l, clk, Options{Leaser: r, Lease: 100 * time.Millisecond, Threshold: 3, Size: SizeDemand})
	ctx := context.Background()
	it := item("cut", sliding(1_000_000, time.Minute), 1)
	step := func() error {
		now := clk.Add(time.Millisecond)
		out := make([]tiers.Decision, 1)
		err := s.Decide(ctx, now, []store.Item{it}, out)
		if err == nil && !out[0].OK {
			t.Fatalf("rejected under the limit: %+v", out[0])
		}
		s.Tick(ctx)
		r.Tick(ctx)
		return err
	}
	for i := 0; s.Stats().LocalGranted < 100; i++ {
		if i > 10_000 {
			t.Fatalf("no sub-lease after 10s on the clock: %+v %+v", s.Stats(), r.Stats())
		}
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	l.cut.Store(true)
	t.Logf("at the cut: %+v %+v", s.Stats(), r.Stats())
	before, calls := s.Stats().LocalGranted, l.calls.Load()
	var failed int
	for range 12_000 { // 12s on the clock: past every slice (6s at most here)
		if err := step(); err != nil {
			if !errors.Is(err, errCut) {
				t.Fatal(err)
			}
			failed++
		}
	}
	local := s.Stats().LocalGranted - before
	if local < 100 {
		t.Errorf("cut off: %d requests granted from the region's slices, want them to go on until the slices end", local)
	}
	if failed == 0 {
		t.Error("cut off for 12s: no request reached the shared path once the slices ended")
	}
	if got := l.calls.Load(); got != calls {
		t.Errorf("%d calls reached the home through a cut link", got-calls)
	}
	// The last 2s on the clock were all on the shared path.
	for range 100 {
		if err := step(); !errors.Is(err, errCut) {
			t.Fatalf("after the slices ended: %v, want the shared path's failure", err)
		}
	}
	t.Logf("cut off: %d granted from slices, then %d on the failing shared path", local, failed)
}
