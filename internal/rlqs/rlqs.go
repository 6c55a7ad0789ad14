package rlqs

import (
	"context"
	"crypto/rand"
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

// Bounds of a report, as RLS bounds a request (engine.MaxEntries,
// engine.MaxLen), and of a stream.
const (
	MaxEntries = 16
	MaxLen     = 1024
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
	// Interval is the period of Tick (Envoy's reporting_interval should
	// match it); TTL the assignments' time to live, cut to whole seconds
	// (Envoy reads whole seconds) and at least one second; Tolerance the
	// relative change of a share worth a new assignment.
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
type Allocator struct {
	o   Options
	log *slog.Logger

	mu      sync.Mutex
	streams map[*Stream]struct{}
	budgets map[string]*budget
	reports map[string]uint64 // per rule
	errs    uint64
	// dirty are the budgets to allocate before the next tick (a new
	// bucket, a first rate); kick tells Run.
	dirty map[*budget]struct{}
	kick  chan struct{}
	// holdUntil is the end of Options.Hold.
	holdUntil time.Time
}

// budget is a budget's local instances.
type budget struct {
	b       sharestore.Budget
	rule    string
	fill    time.Duration
	members map[*bucket]struct{}
}

// bucket is one bucket of one stream.
type bucket struct {
	s      *Stream
	id     map[string]string
	key    string // canonical bucket id
	claim  string // its ID in the store: the stream's and the bucket's
	domain string
	tree   *descriptors.Tree
	budget *budget // nil: unmatched (fallback)
	fall   Kind    // the fallback sent when unmatched

	rate       float64
	known      bool
	active     time.Time // last report with requests
	share      int64
	sent       Action
	sentAt     time.Time
	everSent   bool
	allocating bool
}

// Stream is one Envoy's stream. Report and Close are called by the stream's
// reader; Pending by its writer, when Notify fires.
type Stream struct {
	a         *Allocator
	id        string
	buckets   map[string]*bucket // under a.mu
	pending   []Action           // under a.mu
	pendingOf []*bucket          // the bucket of each pending action
	notify    chan struct{}
	closed    bool
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
	return &Allocator{o: o, log: log, streams: map[*Stream]struct{}{}, budgets: map[string]*budget{}, reports: map[string]uint64{},
		dirty: map[*budget]struct{}{}, kick: make(chan struct{}, 1), holdUntil: o.Now().Add(o.Hold)}, nil
}

// Open starts a stream.
func (a *Allocator) Open() *Stream {
	var b [8]byte
	_, _ = rand.Read(b[:])
	s := &Stream{a: a, id: hex.EncodeToString(b[:]), buckets: map[string]*bucket{}, notify: make(chan struct{}, 1)}
	a.mu.Lock()
	a.streams[s] = struct{}{}
	a.mu.Unlock()
	return s
}

// Notify fires when the stream has pending actions.
func (s *Stream) Notify() <-chan struct{} { return s.notify }

// Pending returns and clears the stream's pending actions.
func (s *Stream) Pending() []Action {
	s.a.mu.Lock()
	defer s.a.mu.Unlock()
	p := s.pending
	s.pending, s.pendingOf = nil, nil
	return p
}

// Close ends the stream: its buckets leave their budgets, whose stores keep
// counting their shares until their leases expire.
func (s *Stream) Close() {
	a := s.a
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, bk := range s.buckets {
		a.leave(bk)
	}
	s.buckets = nil
	s.closed = true
	delete(a.streams, s)
}

// queue adds an action for the stream; under a.mu.
func (s *Stream) queue(bk *bucket, act Action, now time.Time) {
	bk.sent, bk.sentAt, bk.everSent = act, now, true
	// A bucket's newer action replaces one not sent yet: Envoy acts on the
	// last anyway.
	for i, p := range s.pendingOf {
		if p == bk {
			s.pending[i] = act
			return
		}
	}
	s.pending = append(s.pending, act)
	s.pendingOf = append(s.pendingOf, bk)
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// leave removes bk from its budget; under a.mu.
func (a *Allocator) leave(bk *bucket) {
	if bk.budget == nil {
		return
	}
	delete(bk.budget.members, bk)
	if len(bk.budget.members) == 0 {
		delete(a.budgets, bk.budget.b.Key)
	}
	bk.budget = nil
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
	a.mu.Lock()
	defer a.mu.Unlock()
	if s.closed {
		return nil
	}
	tree := a.o.Tree()
	for i, u := range usages {
		if err := checkBucket(u.Bucket); err != nil {
			return fmt.Errorf("%w: bucket_quota_usages[%d].bucket_id %v", ErrInput, i, err)
		}
		key := strconv.Quote(domain) + ":" + Canonical(u.Bucket) // one stream may report several domains
		bk := s.buckets[key]
		if bk == nil {
			if len(s.buckets) >= MaxBuckets {
				return fmt.Errorf("%w (%d)", ErrTooManyBuckets, MaxBuckets)
			}
			bk = &bucket{s: s, id: maps.Clone(u.Bucket), key: key, claim: s.id + "/" + key, domain: domain}
			s.buckets[key] = bk
			a.resolve(bk, tree, now)
			if bk.budget != nil {
				a.dirty[bk.budget] = struct{}{}
			}
		}
		count := u.Allowed + u.Denied
		if count < u.Allowed { // overflow
			count = math.MaxUint64
		}
		// Envoy's first report of a bucket has no elapsed time: its counts
		// are no rate yet, and the bucket keeps an unknown demand.
		if u.Elapsed > 0 {
			if !bk.known && bk.budget != nil {
				// Its first rate: split the budget by it now rather than
				// at the next tick.
				a.dirty[bk.budget] = struct{}{}
			}
			bk.rate = fairshare.Smooth(bk.rate, bk.known, count, u.Elapsed, a.o.Interval)
			bk.known = true
		}
		if count > 0 {
			bk.active = now
		}
		rule := "unmatched"
		if bk.budget != nil {
			rule = bk.budget.rule
		}
		a.reports[rule]++
	}
	if len(a.dirty) > 0 {
		select {
		case a.kick <- struct{}{}:
		default:
		}
	}
	return nil
}

// Flush allocates the budgets that reports marked since the last tick (new
// buckets, first rates). Run calls it shortly after such a report, so that
// many new streams at once cost one allocation per budget.
func (a *Allocator) Flush(ctx context.Context) {
	now := a.o.Now()
	a.mu.Lock()
	dirty := slices.Collect(maps.Keys(a.dirty))
	clear(a.dirty)
	a.mu.Unlock()
	for _, b := range dirty {
		a.allocate(ctx, b, now)
	}
}

// resolve matches bk against tree and joins its budget, or queues the
// fallback; under a.mu.
func (a *Allocator) resolve(bk *bucket, tree *descriptors.Tree, now time.Time) {
	bk.tree = tree
	b, rule, fill, ok := budgetOf(tree, bk.domain, bk.id)
	if !ok {
		bk.fall = Allow
		if a.o.Unmatched == DenyAll {
			bk.fall = Deny
		}
		if rule == "unlimited" {
			bk.fall = Allow
		}
		bk.s.queue(bk, Action{Bucket: bk.id, Kind: bk.fall, TTL: a.o.UnmatchedTTL}, now)
		return
	}
	bg := a.budgets[b.Key]
	if bg == nil {
		bg = &budget{b: b, rule: rule, fill: fill, members: map[*bucket]struct{}{}}
		a.budgets[b.Key] = bg
	}
	bg.members[bk] = struct{}{}
	bk.budget = bg
	bk.active = now
}

// budgetOf resolves a bucket id: its budget, its rule's name (the
// resource) and fill interval; ok false for no limit (rule "unlimited" for
// an unlimited rule).
func budgetOf(tree *descriptors.Tree, domain string, id map[string]string) (b sharestore.Budget, rule string, fill time.Duration, ok bool) {
	if tree == nil {
		return b, "", 0, false
	}
	entries := make([]descriptors.Entry, 0, len(id))
	for _, k := range slices.Sorted(maps.Keys(id)) {
		entries = append(entries, descriptors.Entry{Key: k, Value: id[k]})
	}
	m, matched := tree.Match(domain, entries)
	if !matched || m.Limit == nil {
		return b, "", 0, false
	}
	if m.Limit.Unlimited {
		return b, "unlimited", 0, false
	}
	if m.Policy == nil {
		return b, "", 0, false
	}
	limit, fill, ok := Rate(m.Policy)
	if !ok {
		return b, "", 0, false
	}
	key := m.Resource + ":" + strconv.FormatUint(m.Limit.ID, 16) + ":" + m.Domain
	return sharestore.Budget{Key: key, Limit: limit}, m.Resource, fill, true
}

// Rate is the budget of a policy: limit tokens per fill (whole seconds, at
// least one: Envoy reads whole seconds). A burst-tier policy gives its
// first tier (the base rate; bursts into higher tiers are RLS's), a token
// bucket its refill, a fixed window its limit per unit. A window that is not
// whole seconds is rounded up, which only lowers the rate. ok is false for a
// policy that grants nothing a budget can express (no tiers).
func Rate(p *tiers.Policy) (limit int64, fill time.Duration, ok bool) {
	switch p.Kind {
	case tiers.KindTokenBucket:
		limit, fill = p.Bucket.Refill, p.Bucket.Per
	case tiers.KindFixedWindow:
		limit, fill = p.Window.Limit, p.Window.Unit.Length()
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

// Tick re-resolves buckets against a new tree, abandons idle buckets and
// those no rule limits any more, renews fallbacks, and allocates every
// budget.
func (a *Allocator) Tick(ctx context.Context) {
	now := a.o.Now()
	a.mu.Lock()
	tree := a.o.Tree()
	for s := range a.streams {
		for key, bk := range s.buckets {
			if bk.tree != tree {
				old := bk.budget
				a.leave(bk)
				a.resolve(bk, tree, now)
				if old != nil && bk.budget == nil {
					// The rule is gone: the bucket is abandoned; reported
					// again, it gets the fallback.
					s.queue(bk, Action{Bucket: bk.id, Kind: Abandon}, now)
					delete(s.buckets, key)
					continue
				}
			}
			if bk.budget == nil {
				if now.Sub(bk.sentAt) >= a.o.UnmatchedTTL-a.renewMargin() {
					s.queue(bk, Action{Bucket: bk.id, Kind: bk.fall, TTL: a.o.UnmatchedTTL}, now)
				}
				continue
			}
			if now.Sub(bk.active) >= a.o.IdleAfter {
				a.leave(bk)
				s.queue(bk, Action{Bucket: bk.id, Kind: Abandon}, now)
				delete(s.buckets, key)
			}
		}
	}
	budgets := slices.Collect(maps.Values(a.budgets))
	clear(a.dirty)
	a.mu.Unlock()
	if sw, ok := a.o.Store.(interface{ Sweep(time.Time) }); ok {
		sw.Sweep(now) // a store in memory forgets the budgets nobody reports
	}
	for _, b := range budgets {
		a.allocate(ctx, b, now)
	}
}

// renewMargin is how long before its expiry an assignment is sent again:
// an interval and a half, so that one late tick does not let it lapse.
func (a *Allocator) renewMargin() time.Duration { return a.o.Interval + a.o.Interval/2 }

// allocate splits budget b among its members and queues what changed.
func (a *Allocator) allocate(ctx context.Context, b *budget, now time.Time) {
	if now.Before(a.holdUntil) {
		return
	}
	a.mu.Lock()
	members := slices.Collect(maps.Keys(b.members))
	mine := make([]sharestore.Demand, len(members))
	for i, bk := range members {
		d := fairshare.Unknown
		if bk.known {
			d = fairshare.Demand(bk.rate, b.fill)
		}
		mine[i] = sharestore.Demand{ID: bk.claim, Demand: d}
	}
	a.mu.Unlock()
	if len(members) == 0 {
		return
	}
	shares, err := a.o.Store.Allocate(ctx, now, b.b, mine, a.o.TTL, a.o.Tolerance)
	a.mu.Lock()
	defer a.mu.Unlock()
	if err != nil {
		// Nothing is renewed: the assignments run to their TTL, then Envoy
		// applies its expired_assignment_behavior.
		a.errs++
		a.log.Warn("rlqs: allocating", "rule", b.rule, "err", err.Error())
		return
	}
	for i, bk := range members {
		if bk.budget != b {
			continue // left meanwhile; its lease runs out
		}
		bk.share = shares[i]
		act := Action{Bucket: bk.id, Kind: Assign, Tokens: shares[i], Burst: burst(shares[i]), Fill: b.fill, TTL: a.o.TTL}
		if shares[i] <= 0 {
			act = Action{Bucket: bk.id, Kind: Deny, TTL: a.o.TTL}
		}
		same := bk.everSent && bk.sent.Kind == act.Kind && bk.sent.Tokens == act.Tokens && bk.sent.Fill == act.Fill
		if !same || now.Sub(bk.sentAt) >= a.o.TTL-a.renewMargin() {
			bk.s.queue(bk, act, now)
		}
	}
}

// BurstFraction is the part of a fill's share an assignment's bucket holds.
// Envoy starts a new, full bucket with every new assignment: a bucket as
// large as the share would let each change of share spend a whole share at
// once on top of the refill, and twenty Envoys whose shares change in one
// interval a whole limit. A quarter of a share bounds that, and still
// absorbs bursts of a quarter of a fill interval.
const BurstFraction = 4

func burst(tokens int64) int64 { return max(1, (tokens+BurstFraction-1)/BurstFraction) }

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
