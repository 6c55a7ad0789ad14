package resilient

import (
	"hash/maphash"
	"math"
	"strings"
	"sync/atomic"
	"time"

	"github.com/charonlimit/charon/internal/lru"
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
	m     *lru.Sharded[store.Key, centry]
	seed  maphash.Seed
	epoch atomic.Uint64 // bumped by Flush: calls begun before it do not insert
	gens  [genSlots]atomic.Uint32

	hits, misses, evictions atomic.Uint64
}

// centry is one rejected pair.
type centry struct {
	min       int64 // the group's summed Min the rejection was for
	at, until int64 // µs: when it was rejected, when it may be granted (never: Unbounded)
	gen       uint32
	d         tiers.Decision
}

func newCache(size int) *cache {
	return &cache{m: lru.New[store.Key, centry](cacheShards, (size+cacheShards-1)/cacheShards, store.Key.Hash), seed: maphash.MakeSeed()}
}

func (c *cache) gen(k *store.Key) *atomic.Uint32 {
	h := maphash.String(c.seed, k.Resource) ^ k.PolicyID*0xbf58476d1ce4e5b9
	return &c.gens[(h^h>>31)%genSlots]
}

// lookup answers items at now from the cache when every item is a cached
// rejection valid at now for the same minimum, writing the decisions to out.
// The items hold no refund. A post-paid item of some hits is never answered
// here: its hits must be debited whatever the answer. It counts a hit or a
// miss.
func (c *cache) lookup(now time.Time, items []store.Item, out []tiers.Decision) bool {
	t := now.UnixMicro()
	for i := range items {
		if items[i].Policy.Overdraft && items[i].Hits > 0 {
			c.misses.Add(1)
			return false
		}
	}
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
	sh := c.m.ShardOf(*k)
	sh.Lock()
	en := sh.Peek(*k)
	if en == nil {
		sh.Unlock()
		return false
	}
	e := &en.Value
	if e.min != min || t < e.at || t >= e.until || (global && e.gen != c.gen(k).Load()) {
		sh.Unlock()
		return false
	}
	sh.Touch(en)
	*d = e.d
	until := e.until
	sh.Unlock()
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
		if d.LimitedByGlobal && sharesGlobal(items, i) {
			// The room the global limit left may have gone to this
			// request's other pairs of the resource (store.Apply's cut):
			// a rejection of the request, not of the pair alone.
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
	sh := c.m.ShardOf(*k)
	sh.Lock()
	defer sh.Unlock()
	if c.epoch.Load() != epoch {
		return
	}
	e := sh.Get(*k)
	if e == nil {
		var n int
		e, n = sh.Add(store.Key{Resource: strings.Clone(k.Resource), Domain: strings.Clone(k.Domain), PolicyID: k.PolicyID}, nil)
		c.evictions.Add(uint64(n))
	}
	e.Value = centry{min: min, at: at, until: until, gen: gen, d: *d}
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
	sh := c.m.ShardOf(*k)
	sh.Lock()
	if e := sh.Peek(*k); e != nil {
		sh.Remove(e)
	}
	sh.Unlock()
}

// flush empties the cache; calls in flight do not insert their answers.
func (c *cache) flush() {
	c.epoch.Add(1)
	c.m.Clear()
}

// size returns the number of cached rejections.
func (c *cache) size() int { return c.m.Len() }

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

// sharesGlobal reports whether items holds a take of another pair of item
// i's global state (its resource and policy, a global limit).
func sharesGlobal(items []store.Item, i int) bool {
	it := &items[i]
	if it.Policy.GlobalLimit == 0 {
		return false
	}
	for j := range items {
		o := &items[j]
		if !o.Refund && o.Key.Resource == it.Key.Resource && o.Key.PolicyID == it.Key.PolicyID && o.Key != it.Key {
			return true
		}
	}
	return false
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
