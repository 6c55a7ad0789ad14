package memstore

import (
	"context"
	"hash/maphash"
	"math"
	"math/bits"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unique"

	"github.com/charonlimit/charon/internal/lru"
	"github.com/charonlimit/charon/internal/periodic"
	"github.com/charonlimit/charon/internal/statefile"
	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/tiers"
)

// Defaults of Options.
const (
	DefaultShards  = 64
	MaxShards      = 256
	DefaultMaxKeys = 1 << 20
	// PairBytes bounds the live heap one tracked one-tier pair costs
	// (TestPairCost measures it); KeysFor sizes MaxKeys with it.
	PairBytes = 512
	// LeastKeys is the least MaxKeys that KeysFor returns.
	LeastKeys = 1024
)

// KeysFor returns the MaxKeys whose one-tier pairs fit in heap bytes, between
// LeastKeys and DefaultMaxKeys; DefaultMaxKeys when heap is 0 or less (no
// bound known). A pair of several tiers costs more: heap is a budget for
// the common case, not a hard cap.
func KeysFor(heap int64) int {
	if heap <= 0 {
		return DefaultMaxKeys
	}
	return int(min(max(heap/PairBytes, LeastKeys), DefaultMaxKeys))
}

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
	m         *lru.Sharded[key, entry]
	evictions atomic.Uint64
	expired   atomic.Uint64
	closed    atomic.Bool
	sweeper   *periodic.Loop // nil without Options.SweepInterval
	scratch   sync.Pool
}

var _ store.Store = (*Store)(nil)

// key names a pair's state, or, with global, a resource's global state
// (Domain empty).
type key struct {
	store.Key
	global bool
}

func hashKey(k key, seed maphash.Seed) uint64 {
	h := k.Key.Hash(seed)
	if k.global {
		h = ^h
	}
	return h
}

type entry struct {
	state tiers.State
	// global is the state of a global key (nil for a pair's key): most
	// keys are pairs, and a pair should not carry an unused Global.
	global *tiers.Global
	// forget is when the entry may go, in Unix nanoseconds (math.MinInt64:
	// at once).
	forget int64
	pinned bool // in use by the call holding the shard's lock
	// kind is the Kind of the policy the state was last decided under:
	// what its compact form (a snapshot) needs.
	kind tiers.Kind
}

// forgetAt is t in entry.forget's unit (ns); an instant past what it holds
// (tiers.Forever: a state kept for ever) is never.
func forgetAt(t time.Time) int64 {
	if t.IsZero() {
		return math.MinInt64
	}
	if t.After(maxForget) {
		return math.MaxInt64
	}
	return t.UnixNano()
}

// maxForget is the last instant entry.forget holds.
var maxForget = time.Unix(0, math.MaxInt64)

type scratch struct {
	shard   []int // per item: the shard of its state key, then of its global key (-1: none)
	entries []*lru.Entry[key, entry]
	states  []*tiers.State
	globals []*tiers.Global
	plan    store.Plan
}

// New returns a Store with opts.
func New(opts Options) *Store {
	n := opts.Shards
	if n <= 0 {
		n = DefaultShards
	}
	n = min(1<<bits.Len(uint(n-1)), MaxShards)
	perShard := 0 // unbounded
	switch max := opts.MaxKeys; {
	case max == 0:
		perShard = (DefaultMaxKeys + n - 1) / n
	case max > 0:
		perShard = (max + n - 1) / n
	}
	s := &Store{m: lru.New[key, entry](n, perShard, hashKey)}
	s.scratch.New = func() any { return new(scratch) }
	s.sweeper = periodic.Sweep(opts.SweepInterval, opts.Now, func(now time.Time) { s.Sweep(now) })
	return s
}

// Close stops the sweeper and waits for it; Decide fails with
// store.ErrClosed afterwards. Close is idempotent.
func (s *Store) Close() error {
	s.closed.Store(true)
	s.sweeper.Stop()
	return nil
}

// Evictions returns how many keys were evicted to respect MaxKeys.
func (s *Store) Evictions() uint64 { return s.evictions.Load() }

// Expired returns how many keys Sweep has forgotten.
func (s *Store) Expired() uint64 { return s.expired.Load() }

// Len returns the number of tracked keys (pair and global states).
func (s *Store) Len() int { return s.m.Len() }

// Sweep forgets every key whose forgetting time (tiers.ForgetAt) is not after
// now and returns how many it forgot. It locks one shard at a time.
func (s *Store) Sweep(now time.Time) int {
	n := 0
	for i := range s.m.Shards() {
		sh := s.m.Shard(i)
		sh.Lock()
		n += sh.RemoveIf(func(e *lru.Entry[key, entry]) bool { return !e.Value.pinned && e.Value.forget <= now.UnixNano() })
		sh.Unlock()
	}
	s.expired.Add(uint64(n))
	return n
}

func itemKeys(it *store.Item) (state, global key) {
	state = key{Key: it.Key}
	global = key{Key: store.Key{Resource: it.Key.Resource}, global: true}
	return state, global
}

// Decide implements store.Store. The context is not consulted: the call
// never blocks on anything but the shard locks.
func (s *Store) Decide(_ context.Context, now time.Time, items []store.Item, out []tiers.Decision) error {
	return s.decide(now, time.Time{}, items, out)
}

// decide is Decide at now, or with at store.ApplyReserve for at.
func (s *Store) decide(now, at time.Time, items []store.Item, out []tiers.Decision) error {
	if err := store.CheckDecide(s.closed.Load(), items, out); err != nil {
		return err
	}
	sc := s.scratch.Get().(*scratch)
	sc.shard = sc.shard[:0]
	var locked [MaxShards / 64]uint64
	for i := range items {
		sk, gk := itemKeys(&items[i])
		idx, gidx := s.m.Index(sk), -1
		if items[i].Policy.GlobalLimit > 0 {
			gidx = s.m.Index(gk)
			locked[gidx/64] |= 1 << (gidx % 64)
		}
		locked[idx/64] |= 1 << (idx % 64)
		sc.shard = append(sc.shard, idx, gidx)
	}
	s.lock(&locked, true)
	sc.entries = sc.entries[:0]
	sc.states = sc.states[:0]
	sc.globals = sc.globals[:0]
	for i := range items {
		sk, gk := itemKeys(&items[i])
		e := s.lookup(sc.shard[2*i], sk)
		sc.entries = append(sc.entries, e)
		sc.states = append(sc.states, &e.Value.state)
		if g := sc.shard[2*i+1]; g >= 0 {
			ge := s.lookup(g, gk)
			sc.entries = append(sc.entries, ge)
			if ge.Value.global == nil {
				ge.Value.global = new(tiers.Global)
			}
			sc.globals = append(sc.globals, ge.Value.global)
		} else {
			sc.globals = append(sc.globals, nil)
		}
	}
	sc.plan.Make(items)
	var err error
	if at.IsZero() {
		_, err = store.Apply(now, &sc.plan, items, sc.states, sc.globals, out)
	} else {
		_, err = store.ApplyReserve(now, at, &sc.plan, items, sc.states, sc.globals, out)
	}
	// Recompute the forgetting times of everything the call may have changed;
	// a new, untouched key keeps the zero time and goes at the next sweep.
	k := 0
	for i := range items {
		e := &sc.entries[k].Value
		k++
		e.pinned = false
		e.kind = items[i].Policy.Kind
		e.forget = forgetAt(tiers.ForgetAt(items[i].Policy, &e.state))
		if sc.shard[2*i+1] >= 0 {
			g := &sc.entries[k].Value
			k++
			g.pinned = false
			g.forget = forgetAt(g.global.ForgetAt())
		}
	}
	clear(sc.entries)
	clear(sc.states)
	clear(sc.globals)
	s.scratch.Put(sc)
	s.lock(&locked, false)
	return err
}

// lock locks (or unlocks) the shards of the set bits, in ascending order.
func (s *Store) lock(set *[MaxShards / 64]uint64, lock bool) {
	for w, word := range set {
		for ; word != 0; word &= word - 1 {
			sh := s.m.Shard(w*64 + bits.TrailingZeros64(word))
			if lock {
				sh.Lock()
			} else {
				sh.Unlock()
			}
		}
	}
}

// lookup returns k's entry in shard i, creating it, pinned and most recent.
// The shard is locked by the caller.
func (s *Store) lookup(i int, k key) *lru.Entry[key, entry] {
	sh := s.m.Shard(i)
	e := sh.Get(k)
	if e == nil {
		var n int
		// Every pair of a resource shares one copy of its name.
		k.Resource, k.Domain = unique.Make(k.Resource).Value(), strings.Clone(k.Domain)
		e, n = sh.Add(k, pinned)
		s.evictions.Add(uint64(n))
	}
	e.Value.pinned = true
	return e
}

// pinned keeps the entries of the call in progress from eviction.
func pinned(e *lru.Entry[key, entry]) bool { return e.Value.pinned }

var _ store.Inspector = (*Store)(nil)

var _ store.Reserver = (*Store)(nil)

// Reserve implements store.Reserver: store.ApplyReserve at (now,
// now+after), under the locks Decide takes.
func (s *Store) Reserve(_ context.Context, now time.Time, after time.Duration, items []store.Item, out []tiers.Decision) (time.Time, error) {
	at := now.Add(max(after, 0))
	return at, s.decide(now, at, items, out)
}

// GiveBack implements store.Reserver.
func (s *Store) GiveBack(_ context.Context, now, at time.Time, items []store.Item) error {
	back, out := store.GiveBackItems(items)
	return s.decide(now, at, back, out)
}

// Inspect implements store.Inspector, under the locks of the pair's shards.
func (s *Store) Inspect(_ context.Context, now time.Time, it *store.Item) (tiers.View, error) {
	if s.closed.Load() {
		return tiers.View{}, store.ErrClosed
	}
	sk, gk := itemKeys(it)
	var locked [MaxShards / 64]uint64
	idx, gidx := s.m.Index(sk), -1
	locked[idx/64] |= 1 << (idx % 64)
	if it.Policy.GlobalLimit > 0 {
		gidx = s.m.Index(gk)
		locked[gidx/64] |= 1 << (gidx % 64)
	}
	s.lock(&locked, true)
	defer s.lock(&locked, false)
	var st *tiers.State
	if e := s.m.Shard(idx).Peek(sk); e != nil {
		st = &e.Value.state
	}
	var g *tiers.Global
	if gidx >= 0 {
		g = new(tiers.Global)
		if e := s.m.Shard(gidx).Peek(gk); e != nil && e.Value.global != nil {
			g = e.Value.global
		}
	}
	return tiers.Inspect(it.Policy, st, g, now), nil
}

// Reset implements store.Inspector.
func (s *Store) Reset(_ context.Context, it *store.Item) error {
	if s.closed.Load() {
		return store.ErrClosed
	}
	sk, _ := itemKeys(it)
	sh := s.m.ShardOf(sk)
	sh.Lock()
	defer sh.Unlock()
	if e := sh.Peek(sk); e != nil {
		sh.Remove(e)
	}
	return nil
}

// Snapshot returns the compact form of every state (pair and global) whose
// forgetting time is after now, for a state file, each shard's from its most
// recently used to its least. It locks one shard at a time: a snapshot taken
// while decisions run holds each shard's states as of its own instant.
func (s *Store) Snapshot(now time.Time) []statefile.Record {
	var out []statefile.Record
	t := now.UnixNano()
	for i := range s.m.Shards() {
		sh := s.m.Shard(i)
		sh.Lock()
		sh.RemoveIf(func(e *lru.Entry[key, entry]) bool {
			v := &e.Value
			if v.forget <= t {
				return false
			}
			r := statefile.Record{Resource: e.Key.Resource, Domain: e.Key.Domain, PolicyID: e.Key.PolicyID, Forget: statefile.Never}
			if v.forget != math.MaxInt64 {
				r.Forget = v.forget / 1e3
			}
			switch {
			case e.Key.global && v.global != nil:
				r.State = v.global.AppendCompact(nil)
			case !e.Key.global:
				r.State = v.state.AppendCompact(&tiers.Policy{Kind: v.kind}, nil)
			default:
				return false
			}
			out = append(out, r)
			return false
		})
		sh.Unlock()
	}
	return out
}

// Restore adds the states of recs that are not to be forgotten by now, as
// Snapshot returned them (a record's state replaces a state of the same key
// the store holds), and returns how many it added. It adds them from the
// last to the first, so that the store's least recently used order is the
// snapshot's; eviction under MaxKeys applies as for any new key. Records
// whose state tiers cannot read are skipped (statefile.Decode refuses them
// before).
func (s *Store) Restore(now time.Time, recs []statefile.Record) int {
	n := 0
	t := now.UnixMicro()
	for i := len(recs) - 1; i >= 0; i-- {
		r := &recs[i]
		if r.Forget <= t || len(r.State) == 0 {
			continue
		}
		k := key{Key: store.Key{Resource: r.Resource, Domain: r.Domain, PolicyID: r.PolicyID}, global: r.Global()}
		var v entry
		if k.global {
			v.global = new(tiers.Global)
			if v.global.SetCompact(r.State) != nil {
				continue
			}
		} else {
			v.kind = r.Kind()
			if v.state.SetCompact(&tiers.Policy{Kind: v.kind}, r.State) != nil {
				continue
			}
		}
		v.forget = math.MaxInt64
		if r.Forget != statefile.Never {
			v.forget = forgetAt(time.UnixMicro(r.Forget))
		}
		idx := s.m.Index(k)
		sh := s.m.Shard(idx)
		sh.Lock()
		e := s.lookup(idx, k)
		e.Value = v
		sh.Unlock()
		n++
	}
	return n
}
