package lru

import (
	"hash/maphash"
	"math/bits"
	"sync"
)

// Entry is one key and its value in a shard's recency list. An Entry is
// valid while its shard holds it: until it is removed, evicted or the shard
// cleared, after which Add may reuse it for another key.
type Entry[K comparable, V any] struct {
	// Key is the entry's key; it must not be changed.
	Key K
	// Value is the caller's, read and written under the shard's lock.
	Value      V
	prev, next *Entry[K, V]
}

// Shard is one part of a Sharded map: its entries in a map and a recency
// list, bounded by the Sharded map's per-shard bound. The caller holds the
// lock (Lock, Unlock) around every method call and every use of an entry.
type Shard[K comparable, V any] struct {
	mu   sync.Mutex
	m    map[K]*Entry[K, V]
	head Entry[K, V] // sentinel: head.next is the most recent, head.prev the least
	max  int         // 0: unbounded
	_    [64]byte    // keeps neighbouring shards off each other's cache lines
}

// Lock locks the shard: hold it around every use of the shard and of its
// entries.
func (s *Shard[K, V]) Lock() { s.mu.Lock() }

// Unlock unlocks the shard.
func (s *Shard[K, V]) Unlock() { s.mu.Unlock() }

// Sharded is a map from K to V in a power-of-two number of shards. Create it
// with New; safe for concurrent use as the package documentation says.
type Sharded[K comparable, V any] struct {
	shards []Shard[K, V]
	mask   uint64
	hash   func(K, maphash.Seed) uint64
	seed   maphash.Seed
}

// New returns a Sharded map of shards shards (rounded up to a power of two;
// at least one), each holding at most perShard entries (0 or less: no
// bound). hash(k, seed) spreads the keys over the shards by its low bits;
// the map draws the seed. (maphash.Comparable would do for any K, but from
// generic code it costs several times a hash written for the key.)
func New[K comparable, V any](shards, perShard int, hash func(K, maphash.Seed) uint64) *Sharded[K, V] {
	n := 1
	if shards > 1 {
		n = 1 << bits.Len(uint(shards-1))
	}
	s := &Sharded[K, V]{shards: make([]Shard[K, V], n), mask: uint64(n - 1), hash: hash, seed: maphash.MakeSeed()}
	for i := range s.shards {
		sh := &s.shards[i]
		sh.m = make(map[K]*Entry[K, V])
		sh.head.next, sh.head.prev = &sh.head, &sh.head
		sh.max = max(perShard, 0)
	}
	return s
}

// Shards returns the number of shards.
func (s *Sharded[K, V]) Shards() int { return len(s.shards) }

// Index returns the index of k's shard.
func (s *Sharded[K, V]) Index(k K) int { return int(s.hash(k, s.seed) & s.mask) }

// Shard returns the shard of index i, in [0, Shards()).
func (s *Sharded[K, V]) Shard(i int) *Shard[K, V] { return &s.shards[i] }

// ShardOf returns k's shard.
func (s *Sharded[K, V]) ShardOf(k K) *Shard[K, V] { return &s.shards[s.Index(k)] }

// Len returns the number of entries, locking one shard at a time.
func (s *Sharded[K, V]) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.Lock()
		n += len(sh.m)
		sh.Unlock()
	}
	return n
}

// Clear removes every entry, locking one shard at a time.
func (s *Sharded[K, V]) Clear() {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.Lock()
		sh.Clear()
		sh.Unlock()
	}
}

// Len returns the shard's number of entries.
func (sh *Shard[K, V]) Len() int { return len(sh.m) }

// Peek returns k's entry, or nil, leaving the recency order as it is.
func (sh *Shard[K, V]) Peek(k K) *Entry[K, V] { return sh.m[k] }

// Touch makes e the shard's most recent entry.
func (sh *Shard[K, V]) Touch(e *Entry[K, V]) {
	sh.unlink(e)
	sh.pushFront(e)
}

// Get returns k's entry, made the most recent, or nil.
func (sh *Shard[K, V]) Get(k K) *Entry[K, V] {
	e, ok := sh.m[k]
	if !ok {
		return nil
	}
	sh.Touch(e)
	return e
}

// Add adds k, which the shard must not hold, as its most recent entry with
// the zero Value, and returns the entry and how many entries it evicted to
// respect the bound: the least recent ones for which keep (nil: none) is
// false. When keep holds for every entry the shard grows past its bound.
// The shard keeps k: a key holding strings that the caller may reuse must
// be cloned first.
func (sh *Shard[K, V]) Add(k K, keep func(*Entry[K, V]) bool) (e *Entry[K, V], evicted int) {
	for sh.max > 0 && len(sh.m) >= sh.max {
		victim := sh.head.prev
		for victim != &sh.head && keep != nil && keep(victim) {
			victim = victim.prev
		}
		if victim == &sh.head {
			break
		}
		sh.Remove(victim)
		evicted++
		e = victim
	}
	if e == nil {
		e = new(Entry[K, V])
	} else {
		var zero V
		e.Value = zero
	}
	e.Key = k
	sh.m[k] = e
	sh.pushFront(e)
	return e, evicted
}

// Remove removes e from the shard.
func (sh *Shard[K, V]) Remove(e *Entry[K, V]) {
	sh.unlink(e)
	delete(sh.m, e.Key)
}

// RemoveIf removes every entry for which f is true and returns how many it
// removed.
func (sh *Shard[K, V]) RemoveIf(f func(*Entry[K, V]) bool) int {
	n := 0
	for e := sh.head.next; e != &sh.head; {
		next := e.next
		if f(e) {
			sh.Remove(e)
			n++
		}
		e = next
	}
	return n
}

// Clear removes every entry of the shard.
func (sh *Shard[K, V]) Clear() {
	clear(sh.m)
	sh.head.next, sh.head.prev = &sh.head, &sh.head
}

func (sh *Shard[K, V]) unlink(e *Entry[K, V]) {
	e.prev.next = e.next
	e.next.prev = e.prev
	e.prev, e.next = nil, nil
}

func (sh *Shard[K, V]) pushFront(e *Entry[K, V]) {
	e.prev = &sh.head
	e.next = sh.head.next
	sh.head.next.prev = e
	sh.head.next = e
}
