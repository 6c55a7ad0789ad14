package rlqs

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/fairshare"
	"github.com/charonlimit/charon/internal/sharestore"
	"github.com/charonlimit/charon/tiers"
)

// Defaults applied to zero Options fields.
const (
	DefaultInterval     = time.Second
	DefaultTTL          = 3 * time.Second
	DefaultTolerance    = 0.05
	DefaultUnmatchedTTL = time.Minute
	DefaultIdleAfter    = time.Minute
)

// Fallback is the action for a bucket that no rule limits.
type Fallback uint8

// Fallbacks.
const (
	AllowAll Fallback = iota
	DenyAll
)

// ErrInput is wrapped by the error of a report that cannot be used (an
// empty domain, an empty bucket id, one over the bounds below): the stream
// ends with it.
var ErrInput = errors.New("rlqs: bad report")

// ErrTooManyBuckets ends a stream that reports more than MaxBuckets
// buckets.
var ErrTooManyBuckets = errors.New("rlqs: too many buckets on one stream")

// Bounds of a report, the same as RLS's of a request, and of a stream.
const (
	MaxEntries = descriptors.MaxEntries
	MaxLen     = descriptors.MaxLen
	MaxBuckets = 10000
)

// Options configure an Allocator.
type Options struct {
	// Store keeps the leases; required.
	Store sharestore.Store
	// Tree returns the descriptor tree in force (nil: nothing matches).
	Tree func() *descriptors.Tree
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Interval is the period of Tick (Envoy reports every 5 s, whatever
	// its reporting_interval says); TTL the assignments' time to live, cut
	// to whole seconds (Envoy reads whole seconds) and at least one second;
	// Tolerance the relative change of a share worth a new assignment, and
	// of a demand worth a new claim.
	Interval  time.Duration
	TTL       time.Duration
	Tolerance float64
	// Unmatched is the blanket rule for buckets no rule limits (an unknown
	// domain, no match, an unlimited rule), sent with UnmatchedTTL.
	Unmatched    Fallback
	UnmatchedTTL time.Duration
	// IdleAfter is how long a bucket may report no requests before it is
	// abandoned (abandon_action), its share reclaimed.
	IdleAfter time.Duration
	// Hold, when positive, is how long after New no share is assigned: a
	// store that does not outlive the process (Memory) does not know the
	// assignments a previous process made, which Envoys keep until their
	// TTL. Holding for a TTL, Envoys run their last assignments out (then
	// their expired_assignment_behavior until the next tick) and the
	// shares never sum above the limit across a restart.
	Hold   time.Duration
	Logger *slog.Logger
}

// Kind is the kind of an Action.
type Kind uint8

// Kinds of Action.
const (
	// Assign is a token bucket: Tokens per Fill, at most Burst stored.
	Assign Kind = iota + 1
	// Allow and Deny are blanket rules.
	Allow
	Deny
	// Abandon tells the stream to forget the bucket.
	Abandon
)

// Action is one bucket's answer.
type Action struct {
	Bucket map[string]string
	Kind   Kind
	Tokens int64
	Burst  int64
	Fill   time.Duration
	TTL    time.Duration
}

// Usage is one bucket's part of a report.
type Usage struct {
	Bucket          map[string]string
	Elapsed         time.Duration
	Allowed, Denied uint64
}

// Allocator runs the pipeline. Create it with New; safe for concurrent use.
//
// Locks, taken in this order: a stream's (its buckets, their sent
// assignments, its pending actions), the allocator's (the streams, the
// budgets, the resolution cache), a budget's (its members). A report of
// known buckets takes only its stream's lock, so thousands of streams
// reporting at once do not queue on one lock. A budget's alloc lock
// serialises its allocations and is taken before any stream's lock.
type Allocator struct {
	o   Options
	log *slog.Logger

	mu      sync.Mutex
	streams map[*Stream]struct{}
	budgets map[string]*budget
	reports map[string]*atomic.Uint64 // per rule
	// dirty are the budgets to allocate before the next tick (a new
	// bucket, a first rate); kick tells Run.
	dirty []*budget
	kick  chan struct{}
	// cache resolves lookup keys (see appendLookup) against cacheTree.
	cache     map[string]resolution
	cacheTree *descriptors.Tree
	// holdUntil is the end of Options.Hold.
	holdUntil time.Time
	errs      atomic.Uint64
	// ticks numbers Tick's calls from 1; opened numbers the streams opened:
	// a stream renews on the ticks of its phase (see renewal).
	ticks, opened atomic.Uint64
	// renew is the renewal of assignments, renewFallback of fallbacks.
	renew, renewFallback renewal
}

// resolution is what a bucket id resolves to; see budgetOf.
type resolution struct {
	b     sharestore.Budget
	rule  string
	fill  time.Duration
	scale int64
	ok    bool
}

// maxCache bounds the resolution cache; past it, the cache starts over.
const maxCache = 1 << 16

// budget is a budget's local instances.
type budget struct {
	b     sharestore.Budget
	rule  string
	fill  time.Duration
	scale int64

	mu      sync.Mutex
	members map[*bucket]struct{}

	// stale is set when the budget must be split again rather than its
	// leases renewed: a member joined or left, or a demand changed since
	// the last split. queued is set while the budget
	// is in Allocator.dirty.
	stale, queued atomic.Bool

	// Under alloc: the allocation's scratch space.
	alloc   sync.Mutex
	list    []*bucket
	demands []sharestore.Demand
}

// bucket is one bucket of one stream.
type bucket struct {
	s      *Stream
	id     map[string]string
	key    string // canonical bucket id
	claim  string // its ID in the store: the stream's and the bucket's
	domain string

	// Under s.mu.
	tree      *descriptors.Tree
	budget    *budget // nil: unmatched (fallback)
	fall      Kind    // the fallback sent when unmatched
	reports   *atomic.Uint64
	active    time.Time // last report with requests
	sent      Action
	sentAt    time.Time
	changedAt time.Time // when a strategy other than the last was sent
	everSent  bool
	pendingAt int // 1 + its index in s.pending; 0: none

	// Written under s.mu, read by allocations without it.
	rate  atomic.Uint64 // math.Float64bits of the smoothed rate
	known atomic.Bool
	// share is the latest share; used the demand of the last split; want
	// the demand claimed now (claimOf), in tokens per fill.
	share atomic.Int64
	used  atomic.Int64
	want  atomic.Int64

	// Under s.mu: when the bucket was last reported, its demand estimate,
	// the fill interval of want.
	since    time.Time
	est      estimate
	wantFill time.Duration
}

func (bk *bucket) rateNow() float64 { return math.Float64frombits(bk.rate.Load()) }

// Stream is one Envoy's stream. Report and Close are called by the stream's
// reader; Pending by its writer, when Notify fires.
type Stream struct {
	a      *Allocator
	id     string
	seq    uint64 // its order of opening: its phase (see renewal)
	notify chan struct{}

	mu        sync.Mutex
	buckets   map[string]*bucket // by lookup key
	pending   []Action
	pendingOf []*bucket // the bucket of each pending action
	spare     []Action  // the slice Pending returned last, reused after it
	closed    bool
	// Report's scratch space.
	kbuf  []byte
	kkeys []string
}

// New returns an Allocator.
func New(o Options) (*Allocator, error) {
	if o.Store == nil {
		return nil, errors.New("rlqs: Options.Store is required")
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Tree == nil {
		o.Tree = func() *descriptors.Tree { return nil }
	}
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.TTL <= 0 {
		o.TTL = DefaultTTL
	}
	o.TTL = max(o.TTL.Truncate(time.Second), time.Second)
	if o.Tolerance <= 0 {
		o.Tolerance = DefaultTolerance
	}
	if o.UnmatchedTTL <= 0 {
		o.UnmatchedTTL = DefaultUnmatchedTTL
	}
	o.UnmatchedTTL = max(o.UnmatchedTTL.Truncate(time.Second), time.Second)
	if o.IdleAfter <= 0 {
		o.IdleAfter = DefaultIdleAfter
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Allocator{o: o, log: log, streams: map[*Stream]struct{}{}, budgets: map[string]*budget{},
		reports: map[string]*atomic.Uint64{}, kick: make(chan struct{}, 1), cache: map[string]resolution{},
		holdUntil: o.Now().Add(o.Hold), renew: newRenewal(o.TTL, o.Interval),
		renewFallback: newRenewal(o.UnmatchedTTL, o.Interval)}, nil
}

// Open starts a stream.
func (a *Allocator) Open() *Stream {
	var b [8]byte
	_, _ = rand.Read(b[:])
	s := &Stream{a: a, id: hex.EncodeToString(b[:]), seq: a.opened.Add(1) - 1, buckets: map[string]*bucket{},
		notify: make(chan struct{}, 1)}
	a.mu.Lock()
	a.streams[s] = struct{}{}
	a.mu.Unlock()
	return s
}

// Notify fires when the stream has pending actions.
func (s *Stream) Notify() <-chan struct{} { return s.notify }

// Pending returns and clears the stream's pending actions. The slice is
// the caller's until its next call of Pending, which reuses it.
func (s *Stream) Pending() []Action {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.pending
	for _, bk := range s.pendingOf {
		bk.pendingAt = 0
	}
	clear(s.pendingOf)
	clear(s.spare) // drop the bucket ids of the actions sent before
	s.pending, s.pendingOf, s.spare = s.spare[:0], s.pendingOf[:0], p
	return p
}

// Close ends the stream: its buckets leave their budgets, whose stores keep
// counting their shares until their leases expire.
func (s *Stream) Close() {
	a := s.a
	s.mu.Lock()
	for _, bk := range s.buckets {
		a.leave(bk)
	}
	s.buckets = nil
	s.closed = true
	s.mu.Unlock()
	a.mu.Lock()
	delete(a.streams, s)
	a.mu.Unlock()
}

// queue adds an action for the stream, under s.mu, and reports whether it
// is the first pending one: the caller then wakes the writer (wake), at
// once or, for a tick, once every budget is allocated, so that a stream
// gets one response per tick.
func (s *Stream) queue(bk *bucket, act Action, now time.Time) (first bool) {
	if !bk.everSent || !sameStrategy(bk.sent, act) {
		bk.changedAt = now
	}
	bk.sent, bk.sentAt, bk.everSent = act, now, true
	// A bucket's newer action replaces one not sent yet: Envoy acts on the
	// last anyway.
	if bk.pendingAt > 0 {
		s.pending[bk.pendingAt-1] = act
		return false
	}
	s.pending = append(s.pending, act)
	s.pendingOf = append(s.pendingOf, bk)
	bk.pendingAt = len(s.pending)
	return len(s.pending) == 1
}

// wake tells the stream's writer it has pending actions.
func (s *Stream) wake() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// leave removes bk from its budget; under bk.s.mu.
func (a *Allocator) leave(bk *bucket) {
	b := bk.budget
	if b == nil {
		return
	}
	bk.budget = nil
	a.mu.Lock()
	b.mu.Lock()
	delete(b.members, bk)
	empty := len(b.members) == 0
	b.mu.Unlock()
	if empty && a.budgets[b.b.Key] == b {
		delete(a.budgets, b.b.Key)
	}
	a.mu.Unlock()
	b.stale.Store(true)
}

// markDirty has the budget split by the next Flush.
func (a *Allocator) markDirty(b *budget) {
	b.stale.Store(true)
	if b.queued.Swap(true) {
		return
	}
	a.mu.Lock()
	a.dirty = append(a.dirty, b)
	a.mu.Unlock()
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// checkBucket refuses an empty bucket id, or one over the bounds.
func checkBucket(id map[string]string) error {
	if len(id) == 0 {
		return errors.New("is empty")
	}
	if len(id) > MaxEntries {
		return fmt.Errorf("has %d entries, at most %d", len(id), MaxEntries)
	}
	for k, v := range id {
		if k == "" || len(k) > MaxLen || len(v) > MaxLen {
			return fmt.Errorf("has an empty key, or a key or value longer than %d bytes", MaxLen)
		}
	}
	return nil
}

// Canonical is a bucket id's identity: its entries sorted by key, the order
// in which they are matched against the descriptor tree.
func Canonical(id map[string]string) string {
	var sb strings.Builder
	for _, k := range slices.Sorted(maps.Keys(id)) {
		sb.WriteString(strconv.Quote(k))
		sb.WriteByte('=')
		sb.WriteString(strconv.Quote(id[k]))
		sb.WriteByte(',')
	}
	return sb.String()
}

// appendLookup appends the lookup key of domain's bucket id to buf: the
// domain and the entries sorted by key, each length-prefixed. It identifies
// a bucket as Canonical does, without quoting, so that a report of known
// buckets allocates nothing; keys is scratch space.
func appendLookup(buf []byte, keys []string, domain string, id map[string]string) ([]byte, []string) {
	keys = keys[:0]
	for k := range id {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	buf = binary.AppendUvarint(buf, uint64(len(domain)))
	buf = append(buf, domain...)
	for _, k := range keys {
		v := id[k]
		buf = binary.AppendUvarint(buf, uint64(len(k)))
		buf = append(buf, k...)
		buf = binary.AppendUvarint(buf, uint64(len(v)))
		buf = append(buf, v...)
	}
	return buf, keys
}

// Report records a report of domain's buckets. A bucket no rule limits is
// answered at once (the fallback); a new bucket's budget, or one whose
// bucket reports its first rate, is allocated by the next Flush (Run's,
// within a twentieth of an interval) rather than the next tick.
func (s *Stream) Report(ctx context.Context, domain string, usages []Usage) error {
	if domain == "" || len(domain) > MaxLen {
		return fmt.Errorf("%w: domain is empty or longer than %d bytes", ErrInput, MaxLen)
	}
	a := s.a
	now := a.o.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	var tree *descriptors.Tree
	treeRead, answered := false, false
	defer func() {
		if answered {
			s.wake()
		}
	}()
	for i, u := range usages {
		if err := checkBucket(u.Bucket); err != nil {
			return fmt.Errorf("%w: bucket_quota_usages[%d].bucket_id %v", ErrInput, i, err)
		}
		s.kbuf, s.kkeys = appendLookup(s.kbuf[:0], s.kkeys, domain, u.Bucket) // one stream may report several domains
		bk := s.buckets[string(s.kbuf)]
		if bk == nil {
			if len(s.buckets) >= MaxBuckets {
				return fmt.Errorf("%w (%d)", ErrTooManyBuckets, MaxBuckets)
			}
			key := strconv.Quote(domain) + ":" + Canonical(u.Bucket)
			bk = &bucket{s: s, id: maps.Clone(u.Bucket), key: key, claim: s.id + "/" + key, domain: domain}
			bk.used.Store(fairshare.Unknown)
			bk.want.Store(fairshare.Unknown)
			s.buckets[string(s.kbuf)] = bk
			if !treeRead {
				tree, treeRead = a.o.Tree(), true
			}
			answered = a.resolve(bk, string(s.kbuf), tree, now) || answered
			if bk.budget != nil {
				a.markDirty(bk.budget)
			}
		}
		count := u.Allowed + u.Denied
		if count < u.Allowed { // overflow
			count = math.MaxUint64
		}
		// Envoy's first report of a bucket has no elapsed time, nor has one
		// of a bucket it created within the second before: their counts
		// are no rate, and a bucket without one keeps an unknown demand.
		gap, fresh := now.Sub(bk.since), bk.since.IsZero()
		bk.since = now
		if u.Elapsed > 0 && !fresh {
			w := window(gap, u.Elapsed)
			bk.est.add(count, w)
			bk.rate.Store(math.Float64bits(bk.est.rate))
			first := !bk.known.Swap(true)
			if b := bk.budget; b != nil {
				// Starved: its claim met by a strategy it held all along,
				// it still ran out of tokens.
				cur := bk.want.Load()
				starved := u.Denied > 1 && float64(u.Denied) > starvedFraction*float64(count) && met(bk.share.Load(), cur, a.o.Tolerance) &&
					now.Sub(bk.changedAt) >= w
				claim := claimOf(cur, &bk.est, b.fill, a.o.Tolerance, starved)
				bk.want.Store(claim)
				if first {
					// Its first rate: split the budget by it now rather
					// than at the next tick.
					a.markDirty(b)
				} else if claim != bk.used.Load() {
					// The claim moved (claimOf): split again.
					b.stale.Store(true)
				}
			}
		}
		if count > 0 {
			bk.active = now
		}
		bk.reports.Add(1)
	}
	return nil
}

// Flush allocates the budgets that reports marked since the last tick (new
// buckets, first rates). Run calls it shortly after such a report, so that
// many new streams at once cost one allocation per budget.
func (a *Allocator) Flush(ctx context.Context) {
	now := a.o.Now()
	a.mu.Lock()
	dirty := a.dirty
	a.dirty = nil
	a.mu.Unlock()
	var woken []*Stream
	for _, b := range dirty {
		b.queued.Store(false)
		woken = a.allocate(ctx, b, now, 0, woken)
	}
	for _, s := range woken {
		s.wake()
	}
}

// resolve matches bk (its lookup key lookup) against tree and joins its
// budget, or queues the fallback and reports true; under bk.s.mu.
func (a *Allocator) resolve(bk *bucket, lookup string, tree *descriptors.Tree, now time.Time) (queued bool) {
	bk.tree = tree
	a.mu.Lock()
	if tree != a.cacheTree || len(a.cache) >= maxCache {
		clear(a.cache)
		a.cacheTree = tree
	}
	r, ok := a.cache[lookup]
	if !ok {
		r.b, r.rule, r.fill, r.scale, r.ok = budgetOf(tree, bk.domain, bk.id)
		a.cache[lookup] = r
	}
	counter := "unmatched"
	if r.ok {
		counter = r.rule
	}
	bk.reports = a.reports[counter]
	if bk.reports == nil {
		bk.reports = new(atomic.Uint64)
		a.reports[counter] = bk.reports
	}
	if !r.ok {
		a.mu.Unlock()
		bk.fall = Allow
		if a.o.Unmatched == DenyAll {
			bk.fall = Deny
		}
		if r.rule == "unlimited" {
			bk.fall = Allow
		}
		return bk.s.queue(bk, Action{Bucket: bk.id, Kind: bk.fall, TTL: a.o.UnmatchedTTL}, now)
	}
	bg := a.budgets[r.b.Key]
	if bg == nil {
		bg = &budget{b: r.b, rule: r.rule, fill: r.fill, scale: r.scale, members: map[*bucket]struct{}{}}
		a.budgets[r.b.Key] = bg
	}
	bg.mu.Lock()
	bg.members[bk] = struct{}{}
	bg.mu.Unlock()
	a.mu.Unlock()
	bg.stale.Store(true)
	bk.budget = bg
	bk.active = now
	if bk.wantFill != bg.fill {
		// A claim is in its budget's tokens per fill.
		want := fairshare.Unknown
		if bk.known.Load() {
			want = fairshare.Demand(bk.est.rate, bg.fill)
		}
		bk.want.Store(want)
		bk.wantFill = bg.fill
	}
	return false
}

// budgetOf resolves a bucket id: its budget, its rule's name (the
// resource), and the budget's fill interval: the rule's, or for a shorter
// one minFill, the rule's limit multiplied by scale (see minFill); ok false
// for no limit (rule "unlimited" for an unlimited rule).
func budgetOf(tree *descriptors.Tree, domain string, id map[string]string) (b sharestore.Budget, rule string, fill time.Duration, scale int64, ok bool) {
	if tree == nil {
		return b, "", 0, 0, false
	}
	entries := make([]descriptors.Entry, 0, len(id))
	for _, k := range slices.Sorted(maps.Keys(id)) {
		entries = append(entries, descriptors.Entry{Key: k, Value: id[k]})
	}
	m, matched := tree.Match(domain, entries)
	if !matched || m.Limit == nil {
		return b, "", 0, 0, false
	}
	if m.Limit.Unlimited {
		return b, "unlimited", 0, 0, false
	}
	if m.Policy == nil {
		return b, "", 0, 0, false
	}
	limit, fill, ok := Rate(m.Policy)
	if !ok {
		return b, "", 0, 0, false
	}
	key := m.Resource + ":" + strconv.FormatUint(m.Limit.ID, 16) + ":" + m.Domain
	scale = 1
	if fill < minFill {
		// The key names the unit: replicas splitting in whole tokens per
		// second (an earlier version) keep budgets of their own.
		scale = int64((minFill + fill - 1) / fill)
		key += ":x" + strconv.FormatInt(scale, 10)
	}
	return sharestore.Budget{Key: key, Limit: limit * scale}, m.Resource, fill * time.Duration(scale), scale, true
}

// Rate is the budget of a policy: limit tokens per fill (whole seconds, at
// least one: Envoy reads whole seconds). A burst-tier policy gives its
// first tier (the base rate; bursts into higher tiers are RLS's), a token
// bucket its refill, a fixed window its limit per unit, a calendar unit its
// limit per the period's nominal length. A window that is not
// whole seconds is rounded up, which only lowers the rate. ok is false for a
// policy that grants nothing a budget can express (no tiers).
func Rate(p *tiers.Policy) (limit int64, fill time.Duration, ok bool) {
	switch p.Kind {
	case tiers.KindTokenBucket:
		limit, fill = p.Bucket.Refill, p.Bucket.Per
	case tiers.KindFixedWindow:
		limit, fill = p.Window.Limit, p.Window.Unit.Length()
	case tiers.KindQuota:
		// A rate limit in calendar units: its limit per the period's
		// nominal length (a month of 30 days), as envoyproxy/ratelimit's
		// unit of that name.
		limit, fill = p.Quota.Limit, periodLength(p.Quota.Period)
	default:
		if len(p.Tiers) == 0 {
			return 0, time.Second, true // rejects everything
		}
		limit, fill = p.Tiers[0].Limit, p.Tiers[0].Window
	}
	if fill%time.Second != 0 {
		fill = fill.Truncate(time.Second) + time.Second
	}
	return max(limit, 0), max(fill, time.Second), true
}

// periodLength is a calendar period's nominal length: its unit's
// (tiers.Unit.Length), a quarter three months of 30 days.
func periodLength(per tiers.Period) time.Duration {
	switch per {
	case tiers.PeriodMinute:
		return tiers.UnitMinute.Length()
	case tiers.PeriodHour:
		return tiers.UnitHour.Length()
	case tiers.PeriodDay:
		return tiers.UnitDay.Length()
	case tiers.PeriodWeek:
		return tiers.UnitWeek.Length()
	case tiers.PeriodQuarter:
		return 3 * tiers.UnitMonth.Length()
	case tiers.PeriodYear:
		return tiers.UnitYear.Length()
	}
	return tiers.UnitMonth.Length()
}

// Tick re-resolves buckets against a new tree, abandons idle buckets and
// those no rule limits any more, renews fallbacks, and allocates every
// budget: one whose members and demands did not change since its last split
// has its leases renewed at the shares they hold, when the store can
// (sharestore.Renewer), rather than being split again. Each stream is woken
// once, when every budget is done. Unchanged assignments are sent again
// before they expire, each stream's on the ticks of its phase (see
// renewal).
func (a *Allocator) Tick(ctx context.Context) {
	now := a.o.Now()
	n := a.ticks.Add(1)
	tree := a.o.Tree()
	a.mu.Lock()
	streams := slices.Collect(maps.Keys(a.streams))
	a.mu.Unlock()
	// Sized once: a tick wakes a share of the streams, every one when the
	// assignments change.
	woken := make([]*Stream, 0, len(streams))
	for _, s := range streams {
		if s.tick(tree, now, n) {
			woken = append(woken, s)
		}
	}
	a.mu.Lock()
	budgets := slices.Collect(maps.Values(a.budgets))
	a.mu.Unlock()
	if sw, ok := a.o.Store.(interface{ Sweep(time.Time) }); ok {
		sw.Sweep(now) // a store in memory forgets the budgets nobody reports
	}
	for _, b := range budgets {
		woken = a.allocate(ctx, b, now, n, woken)
	}
	for _, s := range woken {
		s.wake()
	}
}

// tick is Tick's work (tick n) on one stream's buckets; it reports whether
// it queued the first pending action.
func (s *Stream) tick(tree *descriptors.Tree, now time.Time, n uint64) (queued bool) {
	a := s.a
	s.mu.Lock()
	defer s.mu.Unlock()
	for key, bk := range s.buckets {
		if bk.tree != tree {
			old := bk.budget
			a.leave(bk)
			queued = a.resolve(bk, key, tree, now) || queued
			if old != nil && bk.budget == nil {
				// The rule is gone: the bucket is abandoned; reported
				// again, it gets the fallback.
				queued = s.queue(bk, Action{Bucket: bk.id, Kind: Abandon}, now) || queued
				delete(s.buckets, key)
				continue
			}
		}
		if bk.budget == nil {
			if a.renewFallback.needed(now.Sub(bk.sentAt), n, s.seq) {
				queued = s.queue(bk, Action{Bucket: bk.id, Kind: bk.fall, TTL: a.o.UnmatchedTTL}, now) || queued
			}
			continue
		}
		if now.Sub(bk.active) >= a.o.IdleAfter {
			a.leave(bk)
			queued = s.queue(bk, Action{Bucket: bk.id, Kind: Abandon}, now) || queued
			delete(s.buckets, key)
		}
	}
	return queued
}

// renewal is when an unchanged assignment of one TTL is sent again: at the
// latest at the first tick at least due after it was last sent, due being
// the TTL less an interval and a half, so that one late tick does not let
// it lapse. Renewed only then, the assignments first sent on one tick
// (every bucket of a new budget, every budget after a start or a hold)
// would fall due on one tick for ever: the renewals of period ticks in one
// tick, none in the others (docs/performance.md, RLQS). So each stream
// also has a phase among the period ticks (its order of opening modulo
// period): on the ticks of its phase, it renews the assignments that would
// otherwise fall due before its next one. A stream's renewals go out
// together, in one response; the streams spread evenly over the phases, and
// so do their renewals; none is later than at due, some earlier (once after
// an assignment sent off the stream's phase, a new one or a change, then
// every period ticks as before).
type renewal struct {
	due    time.Duration // the latest
	early  time.Duration // the earliest, on the stream's phase
	period uint64        // ticks between two renewals when ticks are on time
}

func newRenewal(ttl, interval time.Duration) renewal {
	due := ttl - (interval + interval/2)
	p := max(1, (due+interval-1)/interval)
	return renewal{due: due, early: due - (p-1)*interval, period: uint64(p)}
}

// needed reports whether an assignment sent gap ago is sent again at tick n
// (0: not a tick, a Flush) by the stream opened seq-th.
func (r renewal) needed(gap time.Duration, n, seq uint64) bool {
	return gap >= r.due || n > 0 && n%r.period == seq%r.period && gap >= r.early
}

// allocate splits budget b among its members, or renews their leases (see
// Tick), and queues what changed or is to be renewed (see renewal); it
// appends to woken the streams that got their first pending action. Flush
// (tick 0) allocates only a stale budget.
func (a *Allocator) allocate(ctx context.Context, b *budget, now time.Time, tick uint64, woken []*Stream) []*Stream {
	if now.Before(a.holdUntil) {
		return woken
	}
	b.alloc.Lock()
	defer b.alloc.Unlock()
	stale := b.stale.Swap(false)
	if !stale && tick == 0 {
		return woken
	}
	b.mu.Lock()
	b.list = slices.AppendSeq(b.list[:0], maps.Keys(b.members))
	b.mu.Unlock()
	members := b.list
	defer clear(members) // drop the pointers: buckets may go away
	if len(members) == 0 {
		return woken
	}
	var shares []int64
	var err error
	renewed := false
	if rn, ok := a.o.Store.(sharestore.Renewer); ok && !stale {
		b.demands = b.demands[:0]
		for _, bk := range members {
			b.demands = append(b.demands, sharestore.Demand{ID: bk.claim, Demand: bk.used.Load()})
		}
		shares, renewed, err = rn.Renew(ctx, now, b.b, b.demands, a.o.TTL)
	}
	if !renewed && err == nil {
		b.demands = b.demands[:0]
		for _, bk := range members {
			b.demands = append(b.demands, sharestore.Demand{ID: bk.claim, Demand: bk.want.Load()})
		}
		shares, err = a.o.Store.Allocate(ctx, now, b.b, b.demands, a.o.TTL, a.o.Tolerance)
	}
	if err != nil {
		// Nothing is renewed: the assignments run to their TTL, then Envoy
		// applies its expired_assignment_behavior. The next tick splits
		// the budget again.
		b.stale.Store(true)
		a.errs.Add(1)
		a.log.Warn("rlqs: allocating", "rule", b.rule, "err", err.Error())
		return woken
	}
	for i, bk := range members {
		if !renewed {
			bk.used.Store(b.demands[i].Demand)
		}
		bk.share.Store(shares[i])
		act := Action{Bucket: bk.id, Kind: Assign, Tokens: shares[i], Fill: b.fill, TTL: a.o.TTL,
			Burst: b.burst(shares[i], met(shares[i], b.demands[i].Demand, a.o.Tolerance))}
		if shares[i] <= 0 {
			act = Action{Bucket: bk.id, Kind: Deny, TTL: a.o.TTL}
		}
		s := bk.s
		s.mu.Lock()
		// A bucket that left meanwhile is skipped: its lease runs out.
		if bk.budget == b {
			same := bk.everSent && sameStrategy(bk.sent, act)
			if (!same || a.renew.needed(now.Sub(bk.sentAt), tick, s.seq)) && s.queue(bk, act, now) {
				woken = append(woken, s)
			}
		}
		s.mu.Unlock()
	}
	return woken
}

// BurstFraction is the part of a fill's share the bucket of an Envoy whose
// demand its share does not meet holds. Envoy starts a new, full bucket
// with every new assignment: a bucket as large as the share would let each
// change of share spend a whole share at once on top of the refill, and
// twenty Envoys whose shares change in one interval a whole limit. A
// quarter of a share bounds that, and still absorbs bursts of a quarter of
// a fill interval; such an Envoy spends its tokens as they come anyway.
const BurstFraction = 4

// MetBurst is the bucket of an Envoy whose share meets its demand (at most
// metSeconds of its share). Its requests arrive at random, and a bucket
// refilled at their mean rate that holds K tokens turns away about 1/(2K)
// of them however fast they come (the bucket's level wanders like a random
// walk between empty and full): a quarter of a share of 8 per second, two
// tokens, turned away a fifth of its requests. 30 tokens turn away under
// 2 %, and let the share lag its demand for a while before any request is
// turned away; the cost is that such Envoys, their buckets full, may spend
// 30 tokens each at once on top of the refill.
const (
	MetBurst   = 30
	metSeconds = 10
)

// burst is the bucket of a share of tokens per fill, met: it meets its
// demand.
func (b *budget) burst(tokens int64, met bool) int64 {
	perFill := (tokens + b.scale - 1) / b.scale // per the rule's fill
	q := max(1, (perFill+BurstFraction-1)/BurstFraction)
	if !met {
		return q
	}
	return max(q, min(MetBurst, int64(math.Ceil(metSeconds*float64(tokens)/b.fill.Seconds()))))
}

// minFill is the least fill interval of a budget: a rule of a shorter
// window (a limit per second) is split in tokens per minFill, its limit
// multiplied to match. Shares are whole tokens per fill: in tokens per
// second, an Envoy needing 8.1 would claim 9, and nine such Envoys would
// leave 8 % of a limit of 100 unused; in tokens per 10 s it claims 81.
const minFill = 10 * time.Second

// sameStrategy reports whether Envoy would take y for the strategy x
// (keeping its token bucket) rather than a new one.
func sameStrategy(x, y Action) bool {
	return x.Kind == y.Kind && x.Tokens == y.Tokens && x.Burst == y.Burst && x.Fill == y.Fill
}

// Run ticks every Interval until ctx ends, and flushes a twentieth of an
// interval after a report marks a budget.
func (a *Allocator) Run(ctx context.Context) {
	t := time.NewTicker(a.o.Interval)
	defer t.Stop()
	var flush <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			a.Tick(ctx)
		case <-a.kick:
			if flush == nil {
				flush = time.After(a.o.Interval / 20)
			}
		case <-flush:
			flush = nil
			a.Flush(ctx)
		}
	}
}
