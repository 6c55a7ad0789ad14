package resilient_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/resilient"
	"github.com/charonlimit/charon/tiers"
)

// shardedFake is a fake remote of parts (a Cluster's masters): each domain
// lives on a part (of), a part can be down (its calls and pings fail), and
// the map can change (a failover, a reshard).
type shardedFake struct {
	*fakeRemote
	mu    sync.Mutex
	of    map[string]string // domain → part
	down  map[string]bool
	calls map[string]int // calls per part, failed ones included
	pings map[string]int
}

func newShardedFake(of map[string]string) *shardedFake {
	return &shardedFake{fakeRemote: newFake(), of: of, down: map[string]bool{}, calls: map[string]int{}, pings: map[string]int{}}
}

func (f *shardedFake) Shards(_ context.Context, items []store.Item, dst []string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range items {
		if p := f.of[items[i].Key.Domain]; !slices.Contains(dst, p) {
			dst = append(dst, p)
		}
	}
	return dst
}

func (f *shardedFake) ShardNames(context.Context) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, p := range f.of {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

func (f *shardedFake) PingShard(ctx context.Context, shard string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pings[shard]++
	if f.down[shard] {
		return errRemote
	}
	return nil
}

func (f *shardedFake) Decide(ctx context.Context, now time.Time, items []store.Item, out []tiers.Decision) error {
	f.mu.Lock()
	var failed bool
	parts := map[string]bool{}
	for i := range items {
		parts[f.of[items[i].Key.Domain]] = true
	}
	for p := range parts {
		f.calls[p]++
		failed = failed || f.down[p]
	}
	f.mu.Unlock()
	if failed {
		return errRemote
	}
	return f.fakeRemote.Decide(ctx, now, items, out)
}

func (f *shardedFake) set(part string, down bool) {
	f.mu.Lock()
	f.down[part] = down
	f.mu.Unlock()
}

func (f *shardedFake) callsOf(part string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[part]
}

// TestShardBreakers: with a remote of parts, a part that fails opens its
// own breaker: its calls go to the failure mode without a remote call, the
// other parts' calls stay remote, and a call spanning a dead and a live
// part goes to the failure mode. A probe pings the open part alone and
// closes its breaker when it answers. ModeUnavailable stays SERVING while a
// part is up.
func TestShardBreakers(t *testing.T) {
	f := newShardedFake(map[string]string{"a": "A", "b": "B", "c": "C"})
	clk := newClock()
	s := resilient.New(f, resilient.Options{Mode: resilient.ModeUnavailable, Now: clk.Now, FailureThreshold: 3, FailureRate: -1, CoolOff: time.Second, CacheSize: -1})
	defer s.Close()
	decide := func(domains ...string) error {
		items := make([]store.Item, len(domains))
		for i, d := range domains {
			items[i] = take(simple, d, 1)
			items[i].Key.Domain = d
		}
		return s.Decide(context.Background(), t0, items, make([]tiers.Decision, len(items)))
	}
	f.set("A", true)
	for i := range 3 {
		if err := decide("a"); !errors.Is(err, resilient.ErrUnavailable) {
			t.Fatalf("call %d on the dead part: %v, want ErrUnavailable", i, err)
		}
		if err := decide("b"); err != nil {
			t.Fatalf("call %d on a live part: %v", i, err)
		}
	}
	byName := func() map[string]resilient.BreakerState {
		m := map[string]resilient.BreakerState{}
		for _, sh := range s.Stats().Shards {
			m[sh.Name] = sh.Breaker
		}
		return m
	}
	if diff := cmp.Diff(map[string]resilient.BreakerState{"A": resilient.BreakerOpen, "B": resilient.BreakerClosed}, byName()); diff != "" {
		t.Errorf("breakers after 3 failures of A (-want +got):\n%s", diff)
	}
	for range 10 {
		if err := decide("a"); !errors.Is(err, resilient.ErrUnavailable) || !errors.Is(err, resilient.ErrBreakerOpen) {
			t.Fatalf("a call on the open part: %v, want ErrBreakerOpen", err)
		}
		if err := decide("a", "c"); !errors.Is(err, resilient.ErrBreakerOpen) {
			t.Fatalf("a call spanning the open part and a live one: %v, want ErrBreakerOpen", err)
		}
		if err := decide("c"); err != nil {
			t.Fatalf("a call on a live part: %v", err)
		}
	}
	if got := f.callsOf("A"); got != 3 {
		t.Errorf("%d calls reached A, want 3: none once its breaker opened", got)
	}
	if got, want := f.callsOf("C"), 10; got != want {
		t.Errorf("%d calls reached C, want %d", got, want)
	}
	if !s.Serving() {
		t.Error("not serving while B and C are up")
	}
	st := s.Stats()
	if st.Breaker != resilient.BreakerOpen || st.BreakerOpens != 1 || st.Remote != 13 {
		t.Errorf("stats %+v: want the whole shown open, 1 opening, 13 remote", st)
	}
	// The cool-off ends: the probe pings A alone, A still down, then up.
	clk.Advance(time.Second)
	if err := s.Probe(context.Background()); !errors.Is(err, errRemote) {
		t.Errorf("Probe with A down: %v, want its error", err)
	}
	f.set("A", false)
	if err := s.Probe(context.Background()); err != nil {
		t.Errorf("Probe with A up: %v", err)
	}
	f.mu.Lock()
	pings := maps(f.pings)
	f.mu.Unlock()
	if diff := cmp.Diff(map[string]int{"A": 2}, pings); diff != "" {
		t.Errorf("pings by part (-want +got):\n%s", diff)
	}
	if err := decide("a"); err != nil {
		t.Errorf("a call on A after its probe: %v", err)
	}
	if st := s.Stats(); st.Breaker != resilient.BreakerClosed {
		t.Errorf("breaker %v after A's probe, want closed", st.Breaker)
	}
	// Every part down: not serving.
	for _, p := range []string{"A", "B", "C"} {
		f.set(p, true)
	}
	for range 3 {
		decide("a")
		decide("b")
		decide("c")
	}
	if s.Serving() {
		t.Error("serving with every part's breaker open")
	}
}

func maps(m map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range m {
		out[k] = v
	}
	return out
}

// TestShardFailover: the slots of a dead part move to another (a replica
// promoted, a reshard): their calls follow them to the new part's breaker,
// closed, and are decided remotely at once; the dead part's breaker is
// forgotten at the next probe.
func TestShardFailover(t *testing.T) {
	f := newShardedFake(map[string]string{"a": "A", "b": "B"})
	s := resilient.New(f, resilient.Options{Mode: resilient.ModeUnavailable, FailureThreshold: 2, FailureRate: -1, CoolOff: time.Hour})
	defer s.Close()
	f.set("A", true)
	for range 2 {
		_ = s.Decide(context.Background(), t0, []store.Item{take(simple, "a", 1)}, make([]tiers.Decision, 1))
	}
	if err := s.Decide(context.Background(), t0, []store.Item{take(simple, "a", 1)}, make([]tiers.Decision, 1)); !errors.Is(err, resilient.ErrBreakerOpen) {
		t.Fatalf("a on A after 2 failures: %v, want the breaker open", err)
	}
	f.mu.Lock()
	f.of["a"] = "A2" // failover: A's replica serves a's slot
	f.mu.Unlock()
	if err := s.Decide(context.Background(), t0, []store.Item{take(simple, "a", 1)}, make([]tiers.Decision, 1)); err != nil {
		t.Fatalf("a on A2 after the failover: %v, want a remote answer", err)
	}
	if got := f.callsOf("A2"); got != 1 {
		t.Errorf("%d calls on A2, want 1", got)
	}
	if err := s.Probe(context.Background()); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, sh := range s.Stats().Shards {
		names = append(names, sh.Name)
	}
	if diff := cmp.Diff([]string{"A2"}, names); diff != "" {
		t.Errorf("breakers after the probe (-want +got):\n%s", diff)
	}
}
