package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/charonlimit/charon/internal/redistest"
	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/storetest"
	"github.com/charonlimit/charon/tiers"
)

// oneTripPair: a store on a Cluster whose dispatchers are off (each script
// goes on its own, through the client's process hooks), an item a of a
// plain limit of 5 and an item b of a plain limit of 1 whose hit is taken,
// in two slots: a call of both is rejected by b's slot after a's granted.
func oneTripPair(t *testing.T) (c *redis.ClusterClient, s *Store, a, b store.Item, ka, kb string) {
	t.Helper()
	c, _, s, a, b, ka, kb = slotsOf(t, &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 5, Window: time.Hour, Active: tiers.Unbounded}}})
	b.Policy = &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 1, Window: time.Hour, Active: tiers.Unbounded}}}
	kb, _ = stateKey(s.prefix, &b)
	if slot(ka) == slot(kb) {
		t.Fatal("test keys share a slot")
	}
	if d := storetest.Decide(t, s, storetest.T0, b)[0]; !d.OK {
		t.Fatalf("b's one hit: %+v", d)
	}
	return c, s, a, b, ka, kb
}

// hitsOf returns the hits it's pair holds (its tier's count).
func hitsOf(t *testing.T, s *Store, it store.Item) int64 {
	t.Helper()
	v, err := s.Inspect(context.Background(), storetest.T0, &it)
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Tiers) == 0 {
		return 0
	}
	return v.Tiers[0].Hits
}

// TestOneTripScripts: a call spanning two slots sends one script per slot
// when both grant, and an undo to the slot that granted when the other
// rejects, which gives its hit back.
func TestOneTripScripts(t *testing.T) {
	c, s, a, b, ka, kb := oneTripPair(t)
	h := &modeHook{seen: map[string]int{}}
	c.AddHook(h.hook())
	out := make([]tiers.Decision, 2)
	if err := s.Decide(context.Background(), storetest.T0, []store.Item{a, b}, out); err != nil {
		t.Fatal(err)
	}
	if !out[0].OK || out[0].Granted != 1 || out[1].OK {
		t.Fatalf("decisions %+v, want a's prediction (granted 1) and b rejected", out)
	}
	want := map[string]int{fmt.Sprint(modeChecked, " ", ka): 1, fmt.Sprint(modeChecked, " ", kb): 1, fmt.Sprint(modeUndo, " ", ka): 1}
	if diff := cmp.Diff(want, h.seen); diff != "" {
		t.Errorf("scripts by mode and key (-want +got):\n%s", diff)
	}
	if n := hitsOf(t, s, a); n != 0 {
		t.Errorf("a holds %d hits after the rejected call, want 0", n)
	}
	if given, failed := s.Undone(); given != 1 || failed != 0 {
		t.Errorf("Undone %d, %d; want 1, 0", given, failed)
	}
	// Both granted: one script per slot, nothing else.
	h.mu.Lock()
	clear(h.seen)
	h.mu.Unlock()
	b.Policy = a.Policy
	kb, _ = stateKey(s.prefix, &b)
	if err := s.Decide(context.Background(), storetest.T0, []store.Item{a, b}, out); err != nil {
		t.Fatal(err)
	}
	if !out[0].OK || !out[1].OK {
		t.Fatalf("decisions %+v, want both granted", out)
	}
	want = map[string]int{fmt.Sprint(modeChecked, " ", ka): 1, fmt.Sprint(modeChecked, " ", kb): 1}
	if diff := cmp.Diff(want, h.seen); diff != "" {
		t.Errorf("scripts by mode and key (-want +got):\n%s", diff)
	}
}

// TestOneTripUndoFails: when the undo of the slot that granted fails (its
// master killed between the two round trips, or the undo's reply lost),
// the call still answers its rejection (the answer is right: a slot
// rejected), Undone counts the failure, and what the slot committed stays
// counted where the master still holds it (here, the undo lost before it
// ran): the rejected call's hit is counted until it leaves its window.
func TestOneTripUndoFails(t *testing.T) {
	c, s, a, b, ka, _ := oneTripPair(t)
	c.AddHook((&fcallHook{drop: func(m int64, k string) bool { return m == modeUndo && k == ka }}).hook())
	out := make([]tiers.Decision, 2)
	if err := s.Decide(context.Background(), storetest.T0, []store.Item{a, b}, out); err != nil {
		t.Fatalf("Decide: %v, want the rejection", err)
	}
	if out[1].OK {
		t.Fatalf("decisions %+v, want b rejected", out)
	}
	if given, failed := s.Undone(); given != 0 || failed != 1 {
		t.Errorf("Undone %d, %d; want 0, 1", given, failed)
	}
	if n := hitsOf(t, s, a); n != 1 {
		t.Errorf("a holds %d hits, want the 1 its undo failed to give back", n)
	}
}

// TestOneTripMasterKilled kills the master of the slot that granted between
// the decide and the undo: the call answers its rejection within the
// undo's time (lateReplyWait, not the caller's), Undone counts the failed
// undo, the other slots are untouched (b keeps its one hit), and the
// killed master's slots fail until it is back (the resilient store's
// failure mode then decides); a master restarted without persistence has
// lost its keys, the rejected call's hit with them.
func TestOneTripMasterKilled(t *testing.T) {
	nodes, c := clusterClient(t)
	p := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 5, Window: time.Hour, Active: tiers.Unbounded}}}
	s := testStore(t, c, Options{Clock: ClockCaller, Pipelines: -1})
	a := item(p, "ra", "a", 1)
	ka, _ := stateKey(s.prefix, &a)
	ctx := context.Background()
	ma, err := c.MasterForKey(ctx, ka)
	if err != nil {
		t.Fatal(err)
	}
	// b: a key on another master.
	var b store.Item
	for i := 0; ; i++ {
		b = item(p, "rb", fmt.Sprint("b", i), 5)
		kb, _ := stateKey(s.prefix, &b)
		mb, err := c.MasterForKey(ctx, kb)
		if err != nil {
			t.Fatal(err)
		}
		if mb.Options().Addr != ma.Options().Addr {
			break
		}
	}
	if d := storetest.Decide(t, s, storetest.T0, b)[0]; !d.OK {
		t.Fatalf("b's five hits: %+v", d)
	}
	b.Hits, b.Min = 1, 1
	var killed atomic.Bool
	c.AddHook((&fcallHook{before: func(m int64, k string) {
		if m == modeUndo && k == ka && killed.CompareAndSwap(false, true) {
			for _, n := range nodes {
				if n.Addr() == ma.Options().Addr {
					n.Kill()
				}
			}
		}
	}}).hook())
	out := make([]tiers.Decision, 2)
	start := time.Now()
	if err := s.Decide(ctx, storetest.T0, []store.Item{a, b}, out); err != nil {
		t.Fatalf("Decide: %v, want the rejection", err)
	}
	if !killed.Load() {
		t.Fatal("no undo was sent")
	}
	if !out[0].OK || out[1].OK {
		t.Fatalf("decisions %+v, want a's prediction and b rejected", out)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("Decide took %v", d)
	}
	if given, failed := s.Undone(); given != 0 || failed != 1 {
		t.Errorf("Undone %d, %d; want 0, 1", given, failed)
	}
	if n := hitsOf(t, s, b); n != 5 {
		t.Errorf("b holds %d hits, want its 5", n)
	}
}

// TestCloseWaitsForGiveBacks: the give-back a failed call spanning slots
// sends in the background (the slot that answered) is joined by Close: held
// until its own deadline (lateReplyWait), it has ended and been counted
// when Close returns, and nothing is left pending.
func TestCloseWaitsForGiveBacks(t *testing.T) {
	c, s, a, b, ka, kb := oneTripPair(t)
	b.Policy = a.Policy
	// b's slot runs the call and loses its reply: the call fails, a's slot
	// gives back its grant in the background, held here until it gives up.
	c.AddHook(failAfter(func(mode int64, key string) bool { return mode == modeChecked && key == kb }).hook())
	held := make(chan struct{})
	var once sync.Once
	c.AddHook(&redistest.Hook{Pipeline: func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
		for _, cmd := range cmds {
			if m, k, ok := fcallMode(cmd); ok && m == modeUndo && k == ka {
				once.Do(func() { close(held) })
				<-ctx.Done()
				for _, cmd := range cmds {
					cmd.SetErr(ctx.Err())
				}
				return ctx.Err()
			}
		}
		return next(ctx, cmds)
	}})
	if err := s.Decide(context.Background(), storetest.T0, []store.Item{a, b}, make([]tiers.Decision, 2)); !errors.Is(err, errInjected) {
		t.Fatalf("Decide: %v, want the lost reply's error", err)
	}
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("no give-back was sent")
	}
	s.Close()
	if given, failed := s.Undone(); given != 0 || failed != 1 {
		t.Errorf("once closed: slots given back %d, failed %d; want the held give-back ended, 0 and 1", given, failed)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Settle(ctx); err != nil {
		t.Errorf("once closed, Settle: %v, want nothing pending", err)
	}
}
