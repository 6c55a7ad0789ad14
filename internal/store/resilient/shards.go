package resilient

import (
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/charonlimit/charon/internal/store"
)

// Sharder is implemented by a remote made of parts that fail on their own:
// a Redis Cluster, whose masters each serve some of the slots. The wrapper
// then keeps a breaker per part (a shard), so that a dead master sends
// only its own slots' calls to the failure mode, and the live masters keep
// deciding. A call is routed by the parts its items go to now: when slots
// move (a failover, a reshard) their calls follow them to the part that
// serves them, and that part's breaker.
type Sharder interface {
	// Shards appends to dst the names of the parts a call of items goes
	// to now, each once (a Cluster: the addresses of the masters serving
	// their slots). None means the remote as a whole.
	Shards(ctx context.Context, items []store.Item, dst []string) []string
	// ShardNames returns the parts known now (a Cluster: its masters), nil
	// when it cannot tell.
	ShardNames(ctx context.Context) []string
	// PingShard checks one part as Ping checks the remote (a Cluster: that
	// master, its function loaded).
	PingShard(ctx context.Context, shard string) error
}

// ShardReplier is implemented by a Sharder that counts the replies it
// read per shard, those whose callers had given up included (Replier, per
// shard): a shard whose replies still come is slow, not down.
type ShardReplier interface {
	ShardReplies(shard string) uint64
}

// shardSet is the breakers of a Sharder's parts, made on first use. Safe
// for concurrent use.
type shardSet struct {
	mu sync.RWMutex
	m  map[string]*breaker
}

// breakerOf returns the breaker of shard, made closed (as s.br is set)
// when there is none.
func (s *Store) breakerOf(shard string) *breaker {
	set := &s.shards
	set.mu.RLock()
	b := set.m[shard]
	set.mu.RUnlock()
	if b != nil {
		return b
	}
	set.mu.Lock()
	defer set.mu.Unlock()
	if b = set.m[shard]; b != nil {
		return b
	}
	b = &breaker{name: shard, threshold: s.br.threshold, rate: s.br.rate, minCalls: s.br.minCalls, window: s.br.window,
		cooloff: s.br.cooloff, onChange: s.br.onChange}
	b.winStart.Store(s.now().UnixNano())
	if set.m == nil {
		set.m = map[string]*breaker{}
	}
	set.m[shard] = b
	return b
}

// route returns the breakers a call of items answers to: its shards' for a
// Sharder (appended to dst), else (or when the Sharder names none) the
// whole remote's.
func (s *Store) route(ctx context.Context, items []store.Item, dst []*breaker) []*breaker {
	if s.sharder == nil {
		return append(dst, &s.br)
	}
	var names [4]string
	sh := s.sharder.Shards(ctx, items, names[:0])
	if len(sh) == 0 {
		return append(dst, &s.br)
	}
	for _, n := range sh {
		dst = append(dst, s.breakerOf(n))
	}
	return dst
}

// allClosed reports whether every breaker of brs lets calls through.
func allClosed(brs []*breaker) bool {
	for _, b := range brs {
		if !b.closed() {
			return false
		}
	}
	return true
}

// answersOf sums the answers of brs' parts: the calls they answered
// through the wrapper and the replies the remote counts (Replier for the
// whole, ShardReplier per shard).
func (s *Store) answersOf(brs []*breaker) uint64 {
	var n uint64
	for _, b := range brs {
		n += b.answers.Load()
		switch {
		case b == &s.br && s.replies != nil:
			n += s.replies.Replies()
		case b != &s.br && s.shardReplies != nil:
			n += s.shardReplies.ShardReplies(b.name)
		}
	}
	return n
}

// retryInOf returns the longest time until the cool-off of brs ends.
func retryInOf(brs []*breaker, now int64) int64 {
	var r int64
	for _, b := range brs {
		r = max(r, b.retryIn(now))
	}
	return r
}

// each returns every breaker: the whole remote's and the shards'.
func (s *Store) each() []*breaker {
	s.shards.mu.RLock()
	defer s.shards.mu.RUnlock()
	out := make([]*breaker, 0, 1+len(s.shards.m))
	out = append(out, &s.br)
	for _, b := range s.shards.m {
		out = append(out, b)
	}
	return out
}

// probeShards pings the shards whose breaker is open and past its
// cool-off, each on its own, closing those that answer. While a breaker is
// open it also forgets the breakers of shards the remote no longer names
// (their slots moved away: a failover, a reshard). It returns the first
// ping's error.
func (s *Store) probeShards(ctx context.Context) error {
	open := false
	for _, b := range s.each() {
		open = open || (b != &s.br && !b.closed())
	}
	if !open {
		return nil
	}
	if names := s.sharder.ShardNames(ctx); len(names) > 0 {
		s.shards.mu.Lock()
		for n := range s.shards.m {
			if !slices.Contains(names, n) {
				delete(s.shards.m, n)
			}
		}
		s.shards.mu.Unlock()
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	now := s.now().UnixNano()
	for _, b := range s.each() {
		if b == &s.br || b.closed() || b.retryIn(now) > 0 || !b.startProbe() {
			continue
		}
		wg.Go(func() {
			defer b.endProbe()
			pctx, cancel := context.WithTimeout(ctx, s.probeTO)
			defer cancel()
			err := s.sharder.PingShard(pctx, b.name)
			switch {
			case err == nil:
				b.close(s.now().UnixNano())
			case errors.Is(pctx.Err(), context.Canceled):
			default:
				s.remoteErrors.Add(1)
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return first
}

// ShardStats are one shard's breaker, for metrics.
type ShardStats struct {
	// Name is the shard's (a Cluster master's address).
	Name string
	// Breaker is its breaker's state, BreakerOpens how many times it
	// opened, Failures the remote calls on it that failed.
	Breaker      BreakerState
	BreakerOpens uint64
	Failures     uint64
}

// shardStats returns the shards' breakers, by name.
func (s *Store) shardStats() []ShardStats {
	s.shards.mu.RLock()
	out := make([]ShardStats, 0, len(s.shards.m))
	for n, b := range s.shards.m {
		out = append(out, ShardStats{Name: n, Breaker: BreakerState(b.state.Load()), BreakerOpens: b.opens.Load(), Failures: b.failures.Load()})
	}
	s.shards.mu.RUnlock()
	slices.SortFunc(out, func(a, b ShardStats) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return out
}
