package redisstore

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/charonlimit/charon/internal/redisconn"
	"github.com/charonlimit/charon/internal/redistest"
	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/tiers"
)

// TestItemSlot: an item's slot, computed without its keys, is its state
// key's (and global key's); every slot has a key of its own.
func TestItemSlot(t *testing.T) {
	g := &tiers.Policy{Kind: tiers.KindTiers, GlobalLimit: 10, Tiers: lyft.Tiers}
	for i := range 2000 {
		for _, p := range []*tiers.Policy{lyft, g} {
			it := store.Item{Key: store.Key{Resource: "res" + strconv.Itoa(i%7), Domain: "user=" + strconv.Itoa(i), PolicyID: uint64(i*31 + 1)}, Policy: p}
			sk, gk := stateKey("pfx:", &it)
			if got, want := itemSlot(&it), slot(sk); got != want {
				t.Fatalf("%+v: itemSlot %d, its key %q's slot %d", it.Key, got, sk, want)
			}
			if gk != "" && slot(gk) != itemSlot(&it) {
				t.Fatalf("%+v: global key %q in slot %d, not %d", it.Key, gk, slot(gk), itemSlot(&it))
			}
		}
	}
	for sl := range uint16(16384) {
		if k := slotKey(sl); slot(k) != sl {
			t.Fatalf("slotKey(%d) = %q, in slot %d", sl, k, slot(k))
		}
	}
}

// TestShards: on a Cluster, a call's shards are the masters serving its
// slots (as Redis itself says: CLUSTER SLOTS), each once; ShardNames are
// the masters; PingShard pings one; a single Redis has no shards.
func TestShards(t *testing.T) {
	nodes := redistest.Cluster(t, 3)
	s := openStore(t, redisconn.Options{ClusterAddrs: redistest.Addrs(nodes)}, Options{})
	ctx := context.Background()
	ranges, err := redistest.Client(t, nodes[0]).ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	masterOf := func(sl uint16) string {
		for _, r := range ranges {
			if int(sl) >= int(r.Start) && int(sl) <= int(r.End) {
				return r.Nodes[0].Addr
			}
		}
		return ""
	}
	var items []store.Item
	want := map[string]bool{}
	for i := range 40 {
		it := item(lyft, "r", "d"+strconv.Itoa(i), 1)
		items = append(items, it)
		want[masterOf(itemSlot(&it))] = true
		got := s.Shards(ctx, []store.Item{it}, nil)
		if len(got) != 1 || got[0] != masterOf(itemSlot(&it)) {
			t.Fatalf("Shards of %s: %v, want [%s]", it.Key.Domain, got, masterOf(itemSlot(&it)))
		}
	}
	got := s.Shards(ctx, items, nil)
	slices.Sort(got)
	var w []string
	for a := range want {
		w = append(w, a)
	}
	slices.Sort(w)
	if !slices.Equal(got, w) {
		t.Errorf("Shards of 40 items: %v, want %v", got, w)
	}
	if names, addrs := s.ShardNames(ctx), redistest.Addrs(nodes); !slices.Equal(names, sorted(addrs)) {
		t.Errorf("ShardNames %v, want %v", names, sorted(addrs))
	}
	if err := s.PingShard(ctx, nodes[2].Addr()); err != nil {
		t.Errorf("PingShard of a live master: %v", err)
	}
	nodes[2].Kill()
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := s.PingShard(pctx, nodes[2].Addr()); err == nil {
		t.Error("PingShard of a killed master: nil")
	}
	if err := s.PingShard(pctx, "127.0.0.1:1"); err == nil {
		t.Error("PingShard of no master: nil")
	}
	single := openStore(t, redisconn.Options{URL: "redis://" + redistest.Single(t).Addr()}, Options{})
	if got := single.Shards(ctx, items, nil); len(got) != 0 {
		t.Errorf("a single Redis's shards: %v, want none", got)
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}
