package resilient

import (
	"hash/maphash"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/tiers"
)

const (
	cacheShards = 64
	// genSlots is the number of refund generations, indexed by a hash of
	// (resource, policy ID): a refund to a resource with a global limit
	// bumps its slot and so invalidates the cached pairs of every resource
	// sharing the slot (a false invalidation only costs a round trip).
	genSlots = 1024
	never    = math.MaxInt64
)

// cache is the exact over-limit cache: pairs the remote rejected, until the
// instant at which they may be granted again. Times are in microseconds since
// the Unix epoch, as in the tiers package, so RetryAfter comes out exact.
type cache struct {
	shards   [cacheShards]cacheShard
	perShard int
	seed     maphash.Seed
	epoch    atomic.Uint64 // bumped by Flush: calls begun before it do not insert
	gens     [genSlots]atomic.Uint32

	hits, misses, evictions atomic.Uint64
	size                    atomic.Int64
}

type cacheShard struct {
	mu   sync.Mutex
	m    map[store.Key]*centry
	head centry // LRU sentinel: head.next is the most recent
	_    [40]byte
}

// centry is one rejected pair.
type centry struct {
	key        store.Key
	min        int64 // the group's summed Min the rejection was for
	at, until  int64 // µs: when it was rejected, when it may be granted (never: Unbounded)
	gen        uint32
	d          tiers.Decision
	prev, next *centry
}

func newCache(size int) *cache {
	c := &cache{perShard: (size + cacheShards - 1) / cacheShards, seed: maphash.MakeSeed()}
	for i := range c.shards {
		sh := &c.shards[i]
		sh.m = make(map[store.Key]*centry)
		sh.head.next, sh.head.prev = &sh.head, &sh.head
	}
	return c
}

func (c *cache) shard(k *store.Key) *cacheShard {
	h := maphash.String(c.seed, k.Resource)
	h = h*0x9e3779b97f4a7c15 ^ maphash.String(c.seed, k.Domain)
	h ^= k.PolicyID * 0xbf58476d1ce4e5b9
	return &c.shards[(h^h>>29)%cacheShards]
}

func (c *cache) gen(k *store.Key) *atomic.Uint32 {
	h := maphash.String(c.seed, k.Resource) ^ k.PolicyID*0xbf58476d1ce4e5b9
	return &c.gens[(h^h>>31)%genSlots]
}

// lookup answers items at now from the cache when every item is a cached
// rejection valid at now for the same minimum, writing the decisions to out.
// The items hold no refund. It counts a hit or a miss.
func (c *cache) lookup(now time.Time, items []store.Item, out []tiers.Decision) bool {
	t := now.UnixMicro()
	for i := range items {
		if l := leaderOf(items, i); l != i {
			out[i] = out[l]
			continue
		}
		it := &items[i]
		if !c.get(t, &it.Key, groupMin(items, i), it.Policy.GlobalLimit > 0, &out[i]) {
			c.misses.Add(1)
			return false
		}
	}
	c.hits.Add(1)
	return true
}

// get writes k's cached rejection at t to d when there is one for min.
func (c *cache) get(t int64, k *store.Key, min int64, global bool, d *tiers.Decision) bool {
	sh := c.shard(k)
	sh.mu.Lock()
	e, ok := sh.m[*k]
	if !ok || e.min != min || t < e.at || t >= e.until || (global && e.gen != c.gen(k).Load()) {
		sh.mu.Unlock()
		return false
	}
	sh.unlink(e)
	sh.pushFront(e)
	*d = e.d
	until := e.until
	sh.mu.Unlock()
	d.Granted = 0
	if until != never {
		d.RetryAfter = time.Duration(until-t) * time.Microsecond
	}
	d.ResetAfter = d.RetryAfter
	return true
}

// insert remembers the rejections the remote answered for items at now,
// unless Flush was called since epoch was read. A granted item may have
// taken hits, which can only delay its pair's grant for a larger minimum: its
// entry, if any, is dropped so that no RetryAfter is answered too early, and
// with a global limit the entries of its resource are invalidated.
func (c *cache) insert(epoch uint64, now time.Time, items []store.Item, out []tiers.Decision) {
	t := now.UnixMicro()
	for i := range items {
		it, d := &items[i], &out[i]
		if it.Refund {
			continue
		}
		if d.OK {
			c.drop(&it.Key)
			if it.Policy.GlobalLimit > 0 && d.Granted > 0 {
				c.gen(&it.Key).Add(1)
			}
			continue
		}
		if it.Shadow || d.RetryAfter <= 0 || leaderOf(items, i) != i {
			continue
		}
		until := int64(never)
		if d.RetryAfter != tiers.Unbounded {
			until = t + d.RetryAfter.Microseconds()
		}
		c.put(epoch, t, until, &it.Key, groupMin(items, i), c.gen(&it.Key).Load(), d)
	}
}

func (c *cache) put(epoch uint64, at, until int64, k *store.Key, min int64, gen uint32, d *tiers.Decision) {
	sh := c.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if c.epoch.Load() != epoch {
		return
	}
	e, ok := sh.m[*k]
	if ok {
		sh.unlink(e)
	} else {
		for len(sh.m) >= c.perShard && sh.head.prev != &sh.head {
			sh.remove(sh.head.prev)
			c.evictions.Add(1)
			c.size.Add(-1)
		}
		e = &centry{key: store.Key{Resource: strings.Clone(k.Resource), Domain: strings.Clone(k.Domain), PolicyID: k.PolicyID}}
		sh.m[e.key] = e
		c.size.Add(1)
	}
	sh.pushFront(e)
	e.min, e.at, e.until, e.gen, e.d = min, at, until, gen, *d
}

// forgetRefunds drops the pairs the refund items of items give hits back to
// and, for a global limit, invalidates the cached pairs of their resource.
func (c *cache) forgetRefunds(items []store.Item) {
	for i := range items {
		it := &items[i]
		if !it.Refund {
			continue
		}
		if it.Policy.GlobalLimit > 0 {
			c.gen(&it.Key).Add(1)
		}
		c.drop(&it.Key)
	}
}

// drop removes k's entry.
func (c *cache) drop(k *store.Key) {
	sh := c.shard(k)
	sh.mu.Lock()
	if e, ok := sh.m[*k]; ok {
		sh.remove(e)
		c.size.Add(-1)
	}
	sh.mu.Unlock()
}

// flush empties the cache; calls in flight do not insert their answers.
func (c *cache) flush() {
	c.epoch.Add(1)
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		c.size.Add(-int64(len(sh.m)))
		clear(sh.m)
		sh.head.next, sh.head.prev = &sh.head, &sh.head
		sh.mu.Unlock()
	}
}

func (sh *cacheShard) unlink(e *centry) {
	e.prev.next = e.next
	e.next.prev = e.prev
	e.prev, e.next = nil, nil
}

func (sh *cacheShard) pushFront(e *centry) {
	e.prev = &sh.head
	e.next = sh.head.next
	sh.head.next.prev = e
	sh.head.next = e
}

func (sh *cacheShard) remove(e *centry) {
	sh.unlink(e)
	delete(sh.m, e.key)
}

// leaderOf returns the first take item sharing item i's key (store.Apply's
// group leader).
func leaderOf(items []store.Item, i int) int {
	for j := 0; j < i; j++ {
		if !items[j].Refund && items[j].Key == items[i].Key {
			return j
		}
	}
	return i
}

// groupMin returns the summed Min of the group led by i: the minimum the
// remote decided the group's rejection for.
func groupMin(items []store.Item, i int) int64 {
	var m int64
	for j := i; j < len(items); j++ {
		if !items[j].Refund && items[j].Key == items[i].Key {
			m += items[j].Min
		}
	}
	return m
}

func hasRefund(items []store.Item) bool {
	for i := range items {
		if items[i].Refund {
			return true
		}
	}
	return false
}
