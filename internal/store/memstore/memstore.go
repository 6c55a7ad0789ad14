package memstore

import (
	"context"
	"hash/maphash"
	"math/bits"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/tiers"
)

// Defaults of Options.
const (
	DefaultShards  = 64
	MaxShards      = 256
	DefaultMaxKeys = 1 << 20
)

// Options configure a Store. The zero value is usable: 64 shards, at most
// DefaultMaxKeys keys, no background sweeper.
type Options struct {
	// Shards is the number of independently locked shards, rounded up to a
	// power of two and capped at MaxShards; 0 means DefaultShards.
	Shards int
	// MaxKeys bounds the tracked keys (pair states and global states). Each
	// shard holds at most ceil(MaxKeys/Shards) keys and evicts its least
	// recently used key to make room; keys in use by the call that needs
	// the room are never evicted, so a shard may exceed its share by the
	// keys of one call. Forgetting a pair early only ever grants more (it
	// loses history), never less. 0 means DefaultMaxKeys; negative means no
	// bound.
	MaxKeys int
	// SweepInterval, when positive, starts a goroutine that calls Sweep with
	// Now() every interval until Close.
	SweepInterval time.Duration
	// Now is the sweeper's clock; nil means time.Now.
	Now func() time.Time
}

// Store is the in-memory store. Safe for concurrent use; create it with New.
type Store struct {
	shards    []shard
	mask      uint64
	perShard  int // 0: unbounded
	seed      maphash.Seed
	evictions atomic.Uint64
	expired   atomic.Uint64
	closed    atomic.Bool
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	scratch   sync.Pool
}

var _ store.Store = (*Store)(nil)

type shard struct {
	mu   sync.Mutex
	m    map[key]*entry
	head entry // sentinel of the LRU list: head.next is the most recent
	_    [40]byte
}

type key struct {
	resource, domain string
	id               uint64
	global           bool
}

type entry struct {
	key        key
	state      tiers.State
	global     tiers.Global
	forget     time.Time
	prev, next *entry
	pinned     bool
}

type scratch struct {
	entries []*entry
	states  []*tiers.State
	globals []*tiers.Global
}

// New returns a Store with opts.
func New(opts Options) *Store {
	n := opts.Shards
	if n <= 0 {
		n = DefaultShards
	}
	n = min(1<<bits.Len(uint(n-1)), MaxShards)
	s := &Store{shards: make([]shard, n), mask: uint64(n - 1), seed: maphash.MakeSeed()}
	switch max := opts.MaxKeys; {
	case max == 0:
		s.perShard = (DefaultMaxKeys + n - 1) / n
	case max > 0:
		s.perShard = (max + n - 1) / n
	}
	for i := range s.shards {
		sh := &s.shards[i]
		sh.m = make(map[key]*entry)
		sh.head.next, sh.head.prev = &sh.head, &sh.head
	}
	s.scratch.New = func() any { return new(scratch) }
	if opts.SweepInterval > 0 {
		now := opts.Now
		if now == nil {
			now = time.Now
		}
		s.stop, s.done = make(chan struct{}), make(chan struct{})
		go s.sweeper(opts.SweepInterval, now)
	}
	return s
}

func (s *Store) sweeper(every time.Duration, now func() time.Time) {
	defer close(s.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.Sweep(now())
		}
	}
}

// Close stops the sweeper; Decide fails with store.ErrClosed afterwards.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		if s.stop != nil {
			close(s.stop)
			<-s.done
		}
	})
	return nil
}

// Evictions returns how many keys were evicted to respect MaxKeys.
func (s *Store) Evictions() uint64 { return s.evictions.Load() }

// Expired returns how many keys Sweep has forgotten.
func (s *Store) Expired() uint64 { return s.expired.Load() }

// Len returns the number of tracked keys (pair and global states).
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// Sweep forgets every key whose forgetting time (tiers.ForgetAt) is not after
// now and returns how many it forgot. It locks one shard at a time.
func (s *Store) Sweep(now time.Time) int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for e := sh.head.next; e != &sh.head; {
			next := e.next
			if !e.pinned && !e.forget.After(now) {
				sh.remove(e)
				n++
			}
			e = next
		}
		sh.mu.Unlock()
	}
	s.expired.Add(uint64(n))
	return n
}

func (s *Store) hash(k *key) uint64 {
	h := maphash.String(s.seed, k.resource)
	h = h*0x9e3779b97f4a7c15 ^ maphash.String(s.seed, k.domain)
	h ^= k.id * 0xbf58476d1ce4e5b9
	if k.global {
		h = ^h
	}
	return h ^ h>>29
}

func itemKeys(it *store.Item) (state, global key) {
	state = key{resource: it.Key.Resource, domain: it.Key.Domain, id: it.Key.PolicyID}
	global = key{resource: it.Key.Resource, id: it.Key.PolicyID, global: true}
	return state, global
}

// Decide implements store.Store. The context is not consulted: the call
// never blocks on anything but the shard locks.
func (s *Store) Decide(_ context.Context, now time.Time, items []store.Item, out []tiers.Decision) error {
	if s.closed.Load() {
		return store.ErrClosed
	}
	if err := store.Check(items); err != nil {
		return err
	}
	var locked [MaxShards / 64]uint64
	for i := range items {
		sk, gk := itemKeys(&items[i])
		idx := s.hash(&sk) & s.mask
		locked[idx/64] |= 1 << (idx % 64)
		if items[i].Policy.GlobalLimit > 0 {
			idx = s.hash(&gk) & s.mask
			locked[idx/64] |= 1 << (idx % 64)
		}
	}
	for w, word := range locked {
		for ; word != 0; word &= word - 1 {
			s.shards[w*64+bits.TrailingZeros64(word)].mu.Lock()
		}
	}
	sc := s.scratch.Get().(*scratch)
	sc.entries = sc.entries[:0]
	sc.states = sc.states[:0]
	sc.globals = sc.globals[:0]
	for i := range items {
		sk, gk := itemKeys(&items[i])
		e := s.lookup(&sk)
		sc.entries = append(sc.entries, e)
		sc.states = append(sc.states, &e.state)
		if items[i].Policy.GlobalLimit > 0 {
			g := s.lookup(&gk)
			sc.entries = append(sc.entries, g)
			sc.globals = append(sc.globals, &g.global)
		} else {
			sc.globals = append(sc.globals, nil)
		}
	}
	_, err := store.Apply(now, items, sc.states, sc.globals, out)
	// Recompute the forgetting times of everything the call may have changed;
	// a new, untouched key keeps the zero time and goes at the next sweep.
	k := 0
	for i := range items {
		e := sc.entries[k]
		k++
		e.pinned = false
		e.forget = tiers.ForgetAt(items[i].Policy, &e.state)
		if items[i].Policy.GlobalLimit > 0 {
			g := sc.entries[k]
			k++
			g.pinned = false
			g.forget = g.global.ForgetAt()
		}
	}
	clear(sc.entries)
	clear(sc.states)
	clear(sc.globals)
	s.scratch.Put(sc)
	for w, word := range locked {
		for ; word != 0; word &= word - 1 {
			s.shards[w*64+bits.TrailingZeros64(word)].mu.Unlock()
		}
	}
	return err
}

// lookup returns k's entry, creating it, pinned and most recent. The shard is
// locked by the caller.
func (s *Store) lookup(k *key) *entry {
	sh := &s.shards[s.hash(k)&s.mask]
	e, ok := sh.m[*k]
	if ok {
		sh.unlink(e)
		sh.pushFront(e)
		e.pinned = true
		return e
	}
	if s.perShard > 0 {
		for len(sh.m) >= s.perShard {
			victim := sh.head.prev
			for victim != &sh.head && victim.pinned {
				victim = victim.prev
			}
			if victim == &sh.head {
				break
			}
			sh.remove(victim)
			s.evictions.Add(1)
		}
	}
	e = &entry{key: key{resource: strings.Clone(k.resource), domain: strings.Clone(k.domain), id: k.id, global: k.global}, pinned: true}
	sh.m[e.key] = e
	sh.pushFront(e)
	return e
}

func (sh *shard) unlink(e *entry) {
	e.prev.next = e.next
	e.next.prev = e.prev
	e.prev, e.next = nil, nil
}

func (sh *shard) pushFront(e *entry) {
	e.prev = &sh.head
	e.next = sh.head.next
	sh.head.next.prev = e
	sh.head.next = e
}

func (sh *shard) remove(e *entry) {
	sh.unlink(e)
	delete(sh.m, e.key)
}
