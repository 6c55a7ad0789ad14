package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/charonlimit/charon/internal/redistest"
	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/tiers"
)

// nodePairs returns n pairs (items of one hit) with policies of every kind,
// each pair in its own slot.
func nodePairs(t *testing.T, n int) []store.Item {
	t.Helper()
	pols := []*tiers.Policy{
		{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 5, Window: time.Second, Active: tiers.Unbounded}}},
		{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 3, Window: time.Second, Active: tiers.Unbounded}, {Limit: 9, Window: time.Second, Active: 2 * time.Second, Cooldown: time.Second}}},
		{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Limit: 4, Unit: tiers.UnitSecond}},
		{Kind: tiers.KindTokenBucket, Bucket: tiers.TokenBucket{Capacity: 6, Refill: 2, Per: time.Second}},
		{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 4, Window: time.Second, Active: tiers.Unbounded}}, GlobalLimit: 7},
	}
	for i, p := range pols {
		q, err := tiers.Normalize(*p)
		if err != nil {
			t.Fatal(err)
		}
		pols[i] = &q
	}
	items := make([]store.Item, n)
	for i := range items {
		items[i] = item(pols[i%len(pols)], fmt.Sprint("nr", i), fmt.Sprint("nd", i), 1)
		items[i].Key.PolicyID = uint64(i + 1)
	}
	return items
}

// nodeCall builds the FCALL (mode 2, as every call of one slot on a
// Cluster) of items on s at now.
func nodeCall(s *Store, items []store.Item, now int64) []any {
	c := new(call)
	c.prepare(s, items, time.UnixMicro(now))
	c.command(s, items, -1, modeChecked, now, "")
	return c.args
}

// reply is a call's answer for comparison: its reply, or "error".
func reply(res string, err error) string {
	if err != nil {
		return "error"
	}
	return res
}

// masterOf returns the node serving key by the Cluster's own view (not the
// client's slot map): the one that answers a command on it.
func masterOf(t *testing.T, nodes []*redistest.Node, key string) *redistest.Node {
	t.Helper()
	for _, n := range nodes {
		c := redis.NewClient(&redis.Options{Addr: n.Addr()})
		err := c.Do(context.Background(), "exists", key).Err()
		c.Close()
		if err == nil {
			return n
		}
	}
	t.Fatalf("no node serves %s", key)
	return nil
}

// moveSlot moves the slot of key, with its keys, from the node from to
// the node to (CLUSTER SETSLOT ... IMPORTING, MIGRATING, MIGRATE, SETSLOT
// NODE on every node), telling no client.
func moveSlot(t *testing.T, nodes []*redistest.Node, key string, from, to *redistest.Node, finish bool) {
	t.Helper()
	sl := fmt.Sprint(slot(key))
	id := func(n *redistest.Node) string {
		out, err := redistest.CLI(n.Port, "cluster", "myid")
		if err != nil {
			t.Fatal(err, out)
		}
		return strings.TrimSpace(out)
	}
	fromID, toID := id(from), id(to)
	cli := func(n *redistest.Node, args ...string) string {
		out, err := redistest.CLI(n.Port, args...)
		if err != nil || strings.HasPrefix(out, "ERR") {
			t.Fatalf("%v: %v %s", args, err, out)
		}
		return out
	}
	cli(to, "cluster", "setslot", sl, "importing", fromID)
	cli(from, "cluster", "setslot", sl, "migrating", toID)
	if !finish {
		return
	}
	for {
		keys := strings.Fields(cli(from, "cluster", "getkeysinslot", sl, "100"))
		if len(keys) == 0 {
			break
		}
		args := append([]string{"migrate", "127.0.0.1", fmt.Sprint(to.Port), "", "0", "5000", "keys"}, keys...)
		cli(from, args...)
	}
	for _, n := range nodes {
		cli(n, "cluster", "setslot", sl, "node", toID)
	}
}

// TestNodeBatch: a dispatcher's batch on a Cluster, sent as one FCALL of
// the Cluster batch function per master (runNodes), answers every call as
// its own FCALL answers the same call on twin keys, and leaves the same
// states (and expiries): with the library missing (the batch loads it),
// with locked keys, with the client's slot map stale after a slot moved
// (the master's batch does not make that slot's calls and they follow
// MOVED), and with a slot migrating (ASK, TRYAGAIN).
func TestNodeBatch(t *testing.T) {
	nodes, c := clusterClient(t)
	ctx := context.Background()
	one := testStore(t, c, Options{Clock: ClockCaller, Pipelines: -1})
	bat := testStore(t, c, Options{Clock: ClockCaller, Pipelines: -1})
	pairs := nodePairs(t, 12)
	r := rand.New(rand.NewPCG(31, 1))
	now := time.Now().Add(time.Hour).UnixMicro()
	batched := 0
	round := func(name string, lock int) {
		t.Helper()
		var calls [][]store.Item
		for i := range pairs {
			calls = append(calls, []store.Item{pairs[i]})
		}
		for range 4 {
			// More calls of some pairs, in order in the batch: some of two
			// items of one pair, some refunds.
			p := pairs[r.IntN(len(pairs))]
			p.Hits = 1 + r.Int64N(3)
			p.Min = p.Hits
			if r.IntN(4) == 0 {
				p.Refund = true
			}
			if r.IntN(3) == 0 {
				calls = append(calls, []store.Item{p, p})
			} else {
				calls = append(calls, []store.Item{p})
			}
		}
		r.Shuffle(len(calls), func(i, j int) { calls[i], calls[j] = calls[j], calls[i] })
		now += r.Int64N(400_000)
		if lock >= 0 {
			for _, s := range []*Store{one, bat} {
				k, _ := stateKey(s.prefix, &pairs[lock])
				if err := c.Set(ctx, lockKey(s.prefix, k), "other", time.Minute).Err(); err != nil {
					t.Fatal(err)
				}
			}
		}
		var d dispatcher
		for _, items := range calls {
			d.batch = append(d.batch, &request{args: nodeCall(bat, items, now), ctx: ctx, done: make(chan struct{}, 1)})
			d.sent = append(d.sent, true)
		}
		bat.runNodes(ctx, &d)
		for _, nb := range d.nodes {
			if len(nb.idx) >= 2 {
				batched++
			}
		}
		for j, items := range calls {
			res, err := c.Do(ctx, nodeCall(one, items, now)...).Text()
			want, got := reply(res, err), reply(d.batch[j].res, d.batch[j].err)
			if err != nil && d.batch[j].err != nil && strings.Contains(err.Error(), "TRYAGAIN") != strings.Contains(d.batch[j].err.Error(), "TRYAGAIN") {
				t.Errorf("%s: call %d of %v: error %v, its own FCALL's %v", name, j, items[0].Key, d.batch[j].err, err)
			}
			if got != want {
				t.Fatalf("%s: call %d of %v: %x (%v), its own FCALL %x (%v)", name, j, items[0].Key, got, d.batch[j].err, want, err)
			}
		}
		for i := range pairs {
			ko, _ := stateKey(one.prefix, &pairs[i])
			kb, _ := stateKey(bat.prefix, &pairs[i])
			so, eo := stored(t, c, ko)
			sb, eb := stored(t, c, kb)
			if so != sb || eo != eb {
				t.Fatalf("%s: pair %d: %x expiring %d, its own FCALLs' %x expiring %d", name, i, sb, eb, so, eo)
			}
		}
		if lock >= 0 {
			for _, s := range []*Store{one, bat} {
				k, _ := stateKey(s.prefix, &pairs[lock])
				c.Del(ctx, lockKey(s.prefix, k))
			}
		}
	}

	// The library missing on every master: the first batch loads it.
	if err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		return m.FunctionFlush(ctx).Err()
	}); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		lock := -1
		if i%4 == 3 {
			lock = r.IntN(len(pairs))
		}
		round(fmt.Sprint("round ", i), lock)
	}
	if batched == 0 {
		t.Fatal("no master got a batch")
	}

	// A slot moved behind the client's back: the master that served it
	// does not make its call (NOTRUN), the others of its batch are made.
	k0, _ := stateKey(bat.prefix, &pairs[0])
	from := masterOf(t, nodes, k0)
	var to *redistest.Node
	for _, n := range nodes {
		if n != from && to == nil {
			to = n
		}
	}
	var mate int // another pair of the same master
	for i := 1; i < len(pairs); i++ {
		k, _ := stateKey(bat.prefix, &pairs[i])
		if masterOf(t, nodes, k) == from {
			mate = i
			break
		}
	}
	if mate == 0 {
		t.Fatal("no other pair on the master of pair 0")
	}
	moveSlot(t, nodes, k0, from, to, true)
	// The former master, as a client whose slot map predates the move
	// would pick it.
	stale := redis.NewClient(&redis.Options{Addr: from.Addr()})
	defer stale.Close()
	before, beforeExp := stored(t, c, k0)
	var d dispatcher
	now += 1000
	for _, i := range []int{0, mate} {
		d.batch = append(d.batch, &request{args: nodeCall(bat, pairs[i:i+1], now), ctx: ctx})
		d.sent = append(d.sent, true)
	}
	nb := &nodeBatch{node: stale, idx: []int{0, 1}}
	bat.runNode(ctx, &d, nb)
	if d.batch[0].err != errNotRun || d.batch[1].err != nil || d.batch[1].res == "" || nb.err != nil {
		t.Fatalf("the former master's batch: %v / %v %q, %v; want errNotRun for the moved slot, the other's reply", d.batch[0].err, d.batch[1].err, d.batch[1].res, nb.err)
	}
	if st, exp := stored(t, c, k0); st != before || exp != beforeExp {
		t.Fatal("the call that was not made changed its state")
	}
	// Keep the twins equal: the mate's call on the other store too.
	if err := c.Do(ctx, nodeCall(one, pairs[mate:mate+1], now)...).Err(); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		round(fmt.Sprint("moved ", i), -1)
	}

	// A slot migrating: its keys still on the source, whose batch does not
	// make its calls; sent alone, they meet TRYAGAIN (some keys here, the
	// lock keys not), as their own FCALLs do.
	k1, _ := stateKey(bat.prefix, &pairs[1])
	from = masterOf(t, nodes, k1)
	to = nil
	for _, n := range nodes {
		if n != from && to == nil {
			to = n
		}
	}
	moveSlot(t, nodes, k1, from, to, false)
	for i := range 3 {
		round(fmt.Sprint("migrating ", i), -1)
	}
}

// TestNodeBatchNodeDown: with a master killed, the calls of its batch fail
// with a connection error (not store.ErrReplied), within the batch's
// deadline, and the other masters' calls are answered (or refused as a
// Cluster down once the others see the master fail).
func TestNodeBatchNodeDown(t *testing.T) {
	nodes, c := clusterClient(t)
	ctx := context.Background()
	bat := testStore(t, c, Options{Clock: ClockCaller, Pipelines: -1})
	if err := bat.Load(ctx); err != nil {
		t.Fatal(err)
	}
	pairs := nodePairs(t, 12)
	now := time.Now().UnixMicro()
	for range 2 {
		// The client learns the slot map; each master answers a batch.
		var d dispatcher
		for i := range pairs {
			d.batch = append(d.batch, &request{args: nodeCall(bat, pairs[i:i+1], now), ctx: ctx})
			d.sent = append(d.sent, true)
		}
		bat.runNodes(ctx, &d)
		for i, r := range d.batch {
			if r.err != nil || r.res == "" {
				t.Fatalf("pair %d: %v", i, r.err)
			}
		}
	}
	k0, _ := stateKey(bat.prefix, &pairs[0])
	dead := masterOf(t, nodes, k0)
	dead.Kill()
	var d dispatcher
	for i := range pairs {
		d.batch = append(d.batch, &request{args: nodeCall(bat, pairs[i:i+1], now), ctx: ctx})
		d.sent = append(d.sent, true)
	}
	bctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	bat.runNodes(bctx, &d)
	down, up := 0, 0
	for i, r := range d.batch {
		k, _ := stateKey(bat.prefix, &pairs[i])
		m, err := c.MasterForKey(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if m.Options().Addr == dead.Addr() {
			down++
			if r.err == nil || errors.Is(r.err, store.ErrReplied) {
				t.Errorf("pair %d on the killed master: %v, want a connection error", i, r.err)
			}
			continue
		}
		up++
		if r.err != nil && !strings.Contains(r.err.Error(), "CLUSTERDOWN") && !strings.Contains(r.err.Error(), "cluster is down") {
			t.Errorf("pair %d on a live master: %v", i, r.err)
		}
		if r.err == nil && (len(r.res) < 16 || f64at([]byte(r.res), 0) != statusDone) {
			t.Errorf("pair %d on a live master: reply %x", i, r.res)
		}
	}
	if down == 0 || up == 0 {
		t.Fatalf("%d pairs on the killed master, %d on the others", down, up)
	}
}
