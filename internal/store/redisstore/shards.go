package redisstore

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/charonlimit/charon/internal/store"
)

// The Redis store is a resilient.Sharder on a Cluster: each master is a
// shard, named by its address as the client's slot map names it, and the
// resilient wrapper keeps a breaker per master. A call's shards are the
// masters that serve its items' slots now, by the client's slot map,
// which go-redis reloads when a MOVED reply, a failed node or its reload
// interval says the slots moved (a failover, a reshard): the calls of a
// moved slot then answer to the breaker of the master that serves it.

// Shards appends to dst the addresses of the masters that serve the slots
// of items now, each once; on a single Redis (or Sentinel) it appends
// nothing (the whole is one shard).
func (s *Store) Shards(ctx context.Context, items []store.Item, dst []string) []string {
	if s.nodes == nil {
		return dst
	}
	for i := range items {
		node, err := s.nodes.MasterForKey(ctx, slotKey(itemSlot(&items[i])))
		if err != nil {
			continue
		}
		if a := node.Options().Addr; !slices.Contains(dst, a) {
			dst = append(dst, a)
		}
	}
	return dst
}

// ShardNames returns the addresses of the Cluster's masters, as the
// client's slot map has them after reloading it; nil on a single Redis or
// when it cannot be reloaded.
func (s *Store) ShardNames(ctx context.Context) []string {
	if s.nodes == nil {
		return nil
	}
	var (
		mu    sync.Mutex
		names []string
	)
	_ = s.nodes.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		mu.Lock()
		names = append(names, m.Options().Addr)
		mu.Unlock()
		return nil
	})
	slices.Sort(names)
	return names
}

// PingShard is Ping of the master at addr alone: PING, then its function
// loaded where it is missing.
func (s *Store) PingShard(ctx context.Context, addr string) error {
	if s.closed.Load() {
		return store.ErrClosed
	}
	if s.nodes == nil {
		return s.Ping(ctx)
	}
	var node *redis.Client
	var mu sync.Mutex
	if err := s.nodes.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		if m.Options().Addr == addr {
			mu.Lock()
			node = m
			mu.Unlock()
		}
		return nil
	}); err != nil {
		return fmt.Errorf("redisstore: ping %s: %w", addr, err)
	}
	if node == nil {
		return fmt.Errorf("redisstore: ping %s: not a master of the Cluster", addr)
	}
	if err := lib.Ready(ctx, node); err != nil {
		return fmt.Errorf("redisstore: ping %s: %w", addr, err)
	}
	return nil
}

// ShardReplies returns the replies read from the master at addr (Replies
// per master), counted by the dispatchers whatever became of their
// callers: a master whose late replies still come is slow, not down.
func (s *Store) ShardReplies(addr string) uint64 {
	if n, ok := s.byShard.Load(addr); ok {
		return n.(*atomic.Uint64).Load()
	}
	return 0
}

// shardReplied counts a reply of the FCALL args (its first key names its
// slot) for the master serving it, on a Cluster.
func (s *Store) shardReplied(ctx context.Context, args []any) {
	if s.nodes == nil || len(args) < 4 {
		return
	}
	key, ok := args[3].(string)
	if !ok {
		return
	}
	node, err := s.nodes.MasterForKey(ctx, key)
	if err != nil {
		return
	}
	addr := node.Options().Addr
	n, ok := s.byShard.Load(addr)
	if !ok {
		n, _ = s.byShard.LoadOrStore(addr, new(atomic.Uint64))
	}
	n.(*atomic.Uint64).Add(1)
}

// itemSlot is the Cluster slot of it's keys (stateKey's hash tag), computed
// without building them.
func itemSlot(it *store.Item) uint16 {
	crc := crcString(0, it.Key.Resource)
	if it.Policy.GlobalLimit <= 0 {
		crc = crcByte(crc, '/')
		crc = crcString(crc, it.Key.Domain)
	}
	return crc & 16383
}

// slotKey returns a key of slot: one the client's slot map can be asked
// about (MasterForKey takes a key) without building the item's keys.
func slotKey(sl uint16) string { return slotKeys()[sl] }

// slotKeys holds, for every slot, the shortest decimal number whose slot it
// is (made once: about 160,000 numbers cover the 16,384 slots).
var slotKeys = sync.OnceValue(func() *[16384]string {
	var keys [16384]string
	left := len(keys)
	for n := 0; left > 0; n++ {
		k := strconv.Itoa(n)
		if sl := slot(k); keys[sl] == "" {
			keys[sl] = k
			left--
		}
	}
	return &keys
})

func crcByte(crc uint16, b byte) uint16 {
	crc ^= uint16(b) << 8
	for range 8 {
		if crc&0x8000 != 0 {
			crc = crc<<1 ^ 0x1021
		} else {
			crc <<= 1
		}
	}
	return crc
}

func crcString(crc uint16, s string) uint16 {
	for i := 0; i < len(s); i++ {
		crc = crcByte(crc, s[i])
	}
	return crc
}

func crcBytes(crc uint16, b []byte) uint16 {
	for _, c := range b {
		crc = crcByte(crc, c)
	}
	return crc
}
