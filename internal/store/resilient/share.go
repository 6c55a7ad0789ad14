package resilient

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/tiers"
)

// The local failure mode divides every limit among the replicas that share
// the remote: N replicas each deciding from their own memory with the whole
// limit would grant N times it while the remote is away. The owner counts
// the replicas while the remote answers (package redisbackend keeps a
// presence key in Redis) and tells the store with SetReplicas; the count
// last told is the one the local mode divides by, so an outage keeps the
// count of the replicas seen before it.

// ShareOf is one replica's share of the limit v among n replicas: v/n
// rounded down, at least 1, so that n replicas together never grant more
// than v when v >= n (and at most n when v < n: a replica that may grant
// nothing cannot serve its callers at all). A v of 0 or less (no limit, or
// a limit that rejects everything) is kept, and so is any v when n < 2.
func ShareOf(v, n int64) int64 {
	if n < 2 || v <= 0 {
		return v
	}
	return max(v/n, 1)
}

// SharePolicy returns p with every limit divided among n replicas by
// ShareOf: each tier's limit, the hard and global limits, a fixed window's
// and a calendar quota's limit, a token bucket's capacity and its refill
// rate. The rate is divided exactly where the bucket allows it (Refill
// per n×Per), else Refill is divided by ShareOf over Per. Durations other
// than a bucket's period, and post-paid counting, are kept. The result has
// p's shape (tiers.Policy.Shape): a pair's local state made under another
// share reads with the new numbers. SharePolicy returns p itself when n < 2
// or p is nil; it never changes p. Safe for concurrent use.
func SharePolicy(p *tiers.Policy, n int64) *tiers.Policy {
	if p == nil || n < 2 {
		return p
	}
	q := *p
	if len(p.Tiers) > 0 {
		q.Tiers = make([]tiers.Tier, len(p.Tiers))
		for i, t := range p.Tiers {
			t.Limit = ShareOf(t.Limit, n)
			q.Tiers[i] = t
		}
	}
	q.HardLimit = ShareOf(p.HardLimit, n)
	q.GlobalLimit = ShareOf(p.GlobalLimit, n)
	q.Window.Limit = ShareOf(p.Window.Limit, n)
	q.Quota.Limit = ShareOf(p.Quota.Limit, n)
	if p.Kind == tiers.KindTokenBucket {
		q.Bucket = shareBucket(p, n)
	}
	return &q
}

// shareBucket is p's token bucket with its capacity and refill rate
// divided among n replicas.
func shareBucket(p *tiers.Policy, n int64) tiers.TokenBucket {
	b := p.Bucket
	b.Capacity = ShareOf(b.Capacity, n)
	exact := b
	if b.Per > 0 && b.Per <= tiers.MaxDuration/time.Duration(n) {
		exact.Per = b.Per * time.Duration(n)
		probe := tiers.Policy{Kind: tiers.KindTokenBucket, Bucket: exact, Overdraft: p.Overdraft}
		if tiers.Validate(&probe) == nil {
			return exact
		}
	}
	b.Refill = ShareOf(b.Refill, n)
	return b
}

// maxShared bounds the policies a shares keeps; past it the map starts
// afresh (a policy per request's own limit could grow it without bound).
const maxShared = 10_000

// shares divides the local failure mode's limits among the replicas last
// counted, making each policy's share once per count. The zero value
// counts no replicas (whole limits). Safe for concurrent use.
type shares struct {
	n atomic.Int64 // replicas last counted; below 2: whole limits

	mu sync.RWMutex
	of int64 // the count m was made for
	m  map[*tiers.Policy]*tiers.Policy
}

// set records the replicas counted.
func (sh *shares) set(n int64) { sh.n.Store(max(n, 0)) }

// forget drops the policies made (the configuration changed).
func (sh *shares) forget() {
	sh.mu.Lock()
	sh.m = nil
	sh.mu.Unlock()
}

// policy returns p's share among n replicas.
func (sh *shares) policy(p *tiers.Policy, n int64) *tiers.Policy {
	if n < 2 {
		return p
	}
	sh.mu.RLock()
	q, ok := sh.m[p]
	ok = ok && sh.of == n
	sh.mu.RUnlock()
	if ok {
		return q
	}
	q = SharePolicy(p, n)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.of != n || sh.m == nil || len(sh.m) >= maxShared {
		sh.m, sh.of = make(map[*tiers.Policy]*tiers.Policy), n
	} else if r, ok := sh.m[p]; ok {
		return r // made meanwhile: one share per policy
	}
	sh.m[p] = q
	return q
}

// items returns items with their policies divided among the replicas
// counted now, copied into buf when it has room; items itself when fewer
// than 2 replicas are counted. Items that carry one policy carry one
// share (one count for the call, and one pointer even if the map starts
// afresh meanwhile), as items of one key must.
func (sh *shares) items(items []store.Item, buf []store.Item) []store.Item {
	n := sh.n.Load()
	if n < 2 {
		return items
	}
	out := append(buf[:0], items...)
next:
	for i := range out {
		for j := range i {
			if items[j].Policy == items[i].Policy {
				out[i].Policy = out[j].Policy
				continue next
			}
		}
		out[i].Policy = sh.policy(items[i].Policy, n)
	}
	return out
}
