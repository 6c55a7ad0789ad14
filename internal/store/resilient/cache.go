package resilient

import (
	"hash/maphash"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/charonlimit/charon/internal/lru"
	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/tiers"
)

const (
	cacheShards = 64
	// genSlots is the number of refund generations, indexed by a hash of
	// the resource (whose domains share its global state whatever their
	// policies' shapes): a refund to a resource with a global limit
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
	plans sync.Pool // *store.Plan: a call's grouping, for lookup and insert

	hits, misses, evictions atomic.Uint64
}

// centry is one rejected pair.
type centry struct {
	min       int64 // the group's summed Min the rejection was for
	at, until int64 // µs: when it was rejected, when it may be granted (never: Unbounded)
	gen       uint32
	d         tiers.Decision
	// pol is the policy the rejection was decided under: a key keeps its
	// state when the limits change (a request's own limit differs from
	// the last one), and the new limits may grant what the old refused.
	pol *tiers.Policy
}

func newCache(size int) *cache {
	c := &cache{m: lru.New[store.Key, centry](cacheShards, (size+cacheShards-1)/cacheShards, store.Key.Hash), seed: maphash.MakeSeed()}
	c.plans.New = func() any { return new(store.Plan) }
	return c
}

// plan returns items' plan, to give back with putPlan once the call is
// done with it.
func (c *cache) plan(items []store.Item) *store.Plan {
	p := c.plans.Get().(*store.Plan)
	p.Make(items)
	return p
}

func (c *cache) putPlan(p *store.Plan) { c.plans.Put(p) }

func (c *cache) gen(k *store.Key) *atomic.Uint32 {
	h := maphash.String(c.seed, k.Resource)
	return &c.gens[(h^h>>31)%genSlots]
}

// lookup answers items at now from the cache when every group of plan (the
// items' Plan) is a cached rejection valid at now for the same minimum,
// writing the decisions to out. The items hold no refund. A post-paid group
// of some hits must be debited whatever the answer: it is answered here
// only when debts says its hits are summed and sent later (the caller's
// debts.add), else never. It counts a hit or a miss.
func (c *cache) lookup(now time.Time, plan *store.Plan, items []store.Item, out []tiers.Decision, debts bool) bool {
	t := now.UnixMicro()
	for i := range items {
		if hits, _ := plan.Sums(i); !debts && plan.Leads(i) && plan.PostPaid(i) && hits > 0 {
			c.misses.Add(1)
			return false
		}
	}
	for i := range items {
		if l := plan.Leader(i); l != i {
			out[i] = out[l]
			continue
		}
		it := &items[i]
		_, min := plan.Sums(i)
		if !c.get(t, &it.Key, it.Policy, min, &out[i]) {
			c.misses.Add(1)
			return false
		}
	}
	c.hits.Add(1)
	return true
}

// get writes k's cached rejection at t to d when there is one for min
// under pol.
func (c *cache) get(t int64, k *store.Key, pol *tiers.Policy, min int64, d *tiers.Decision) bool {
	global := pol.GlobalLimit > 0
	sh := c.m.ShardOf(*k)
	sh.Lock()
	en := sh.Peek(*k)
	if en == nil {
		sh.Unlock()
		return false
	}
	e := &en.Value
	if e.min != min || e.pol != pol || t < e.at || t >= e.until || (global && e.gen != c.gen(k).Load()) {
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

// insert remembers the rejections the remote answered for the groups of
// plan (the items' Plan) at now, unless Flush was called since epoch was
// read. A granted item may have
// taken hits, which can only delay its pair's grant for a larger minimum: its
// entry, if any, is dropped so that no RetryAfter is answered too early, and
// with a global limit the entries of its resource are invalidated.
func (c *cache) insert(epoch uint64, now time.Time, plan *store.Plan, items []store.Item, out []tiers.Decision) {
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
		if !plan.Leads(i) || plan.Shadow(i) || d.RetryAfter <= 0 || it.Policy.Concurrency {
			// A concurrency limit's RetryAfter is when its oldest slot
			// frees itself: a refund, on any process, frees one sooner.
			continue
		}
		if d.LimitedByGlobal && plan.SharesGlobal(i) {
			// The room the global limit left may have gone to this
			// request's other pairs of the resource (store.Apply's cut):
			// a rejection of the request, not of the pair alone.
			continue
		}
		until := int64(never)
		if d.RetryAfter != tiers.Unbounded {
			until = t + d.RetryAfter.Microseconds()
		}
		_, min := plan.Sums(i)
		c.put(epoch, t, until, &it.Key, it.Policy, min, c.gen(&it.Key).Load(), d)
	}
}

func (c *cache) put(epoch uint64, at, until int64, k *store.Key, pol *tiers.Policy, min int64, gen uint32, d *tiers.Decision) {
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
	e.Value = centry{min: min, at: at, until: until, gen: gen, d: *d, pol: pol}
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

func hasRefund(items []store.Item) bool {
	for i := range items {
		if items[i].Refund {
			return true
		}
	}
	return false
}
