package escrow

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/sharestore"
	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/tiers"
)

// Defaults of Options.
const (
	DefaultLease     = time.Second
	DefaultThreshold = 50
	DefaultMaxKeys   = 10_000
	DefaultRebalance = time.Second
	// CoolOff is how long a pair's decision rate must stay under half the
	// threshold before it leaves escrow.
	CoolOff = 2 * time.Second
	// minUses is the fewest decisions a pair must make over one lease to
	// be leased: a lease costs about three calls (its reservation, its
	// check, its give-back), a decision on the shared path one; from ten
	// decisions a lease, leasing saves at least 70% of the calls.
	minUses = 10
	// sketchPeriod is the interval over which a pair's decisions are
	// counted to find it hot.
	sketchPeriod = time.Second
	// headroom is how much more than its expected use over one lease a
	// lease asks for: what is not used is given back when it ends.
	headroom = 1.25
	// tolerance is fairshare's: a change of a share smaller than this
	// fraction keeps the old one.
	tolerance = 0.1
)

// Sizing is how big a lease is.
type Sizing int

const (
	// SizeFair (the default) caps what one replica's leases hold in a
	// pair's window at its max-min fair share of the pair's limit, by the
	// demand every replica in escrow on the pair reports to Options.Shares.
	// Beyond it the replica's requests take the shared path, so that they
	// take only what no lease holds.
	SizeFair Sizing = iota
	// SizeDemand sizes a lease by this replica's demand alone, up to the
	// limit: the first replica to ask may hold the whole budget.
	SizeDemand
)

// String returns the sizing's name as --escrow-size takes it.
func (z Sizing) String() string {
	if z == SizeDemand {
		return "demand"
	}
	return "fair"
}

// Set parses fair or demand (flag.Value).
func (z *Sizing) Set(s string) error {
	switch s {
	case "fair":
		*z = SizeFair
	case "demand":
		*z = SizeDemand
	default:
		return fmt.Errorf("unknown lease sizing %q (want fair or demand)", s)
	}
	return nil
}

// Leaser is the shared store leases are taken from: it reserves a lease
// (Reserve), checks the pair's counts (Decide of a check) and gives back
// what a lease did not grant (GiveBack). It must be the shared store
// itself, never one that may reserve in this process's memory instead
// (the resilient store's local failure mode): a give-back on the shared
// store of hits it never reserved would take back other replicas' hits.
type Leaser interface {
	store.Store
	store.Reserver
}

// Options configure a Store. Remote is required; the zero value of every
// other field is its default.
type Options struct {
	// Remote decides every request that is not decided from a lease: the
	// shared store behind its failure mode (the resilient store).
	Remote store.Store
	// Leaser is where leases are taken from; nil means Remote, which must
	// then be a store.Reserver.
	Leaser Leaser
	// Default is whether escrow applies to a rule whose descriptor does
	// not say (escrow: true or false): the server-wide --escrow.
	Default bool
	// Lease is the longest lease (default DefaultLease): a pair's leases
	// last a tiers.LeaseRatio-th of its policy's shortest window, at most
	// this (tiers.LeaseFor); a policy whose window is under LeaseRatio
	// tiers.MinLease stays on Remote.
	Lease time.Duration
	// Threshold is the decisions per second of one pair on this replica
	// from which the pair is decided from leases (default
	// DefaultThreshold; at least 10 per lease length, below which leasing
	// saves too few calls); it leaves escrow when its rate
	// stays under half of it for CoolOff.
	Threshold float64
	// Size is the sizing of leases; SizeFair needs Shares.
	Size Sizing
	// Shares keeps every replica's fair share of each pair in escrow
	// (the store RLQS uses: replicas on one Redis share it); nil with
	// SizeFair sizes by demand. ID names this replica in it (default: a
	// random name).
	Shares sharestore.Store
	ID     string
	// Rebalance is how often each pair's fair shares are computed again
	// (default DefaultRebalance).
	Rebalance time.Duration
	// MaxKeys bounds the pairs in escrow at once (default DefaultMaxKeys).
	MaxKeys int
	// Regional says that Leaser is a region's (a Region, or a wrapper of
	// one; a *Region is seen without it): leases last at most
	// RegionReplicaLease, and a pair is leased from Threshold decisions a
	// second alone (a lease costs calls to the region's Redis, a decision
	// on Remote a round trip to the home).
	Regional bool
	// Now is the clock; nil means time.Now. It must be the clock the
	// callers pass to Decide.
	Now func() time.Time
	// Run starts the goroutine that calls Tick every quarter of the
	// shortest lease, and sooner when leases run short; without it the
	// caller calls Tick.
	Run bool
	// Logger receives the pairs entering and leaving escrow (debug) and
	// failures; nil discards them.
	Logger *slog.Logger
}

// Store is a store.Store that decides the requests of hot pairs from
// escrow leases and every other one on Remote (see the package
// documentation). Create it with New; Close it. Safe for concurrent use.
type Store struct {
	remote  store.Store
	leaser  Leaser
	def     bool
	lease   time.Duration
	thresh  float64
	size    Sizing
	shares  sharestore.Store
	id      string
	rebal   time.Duration
	maxKeys int
	now     func() time.Time
	log     *slog.Logger
	// step is the loop's period in ns: a quarter of the shortest lease of
	// the pairs in escrow.
	step atomic.Int64
	// callTimeout bounds each call to the leaser.
	callTimeout time.Duration

	rules  atomic.Pointer[ruleSet]
	next   func(*descriptors.Tree) // Wiring.SetTree
	region *Region                 // the leaser, when Flags.Open made it: closed after the Store
	// regional: the leaser is a Region (its leases come from a region's
	// pool; see New).
	regional bool
	entries  sync.Map // store.Key → *entry
	nkeys    atomic.Int64
	hot      sketch
	calls    sync.Pool // *call

	wake   chan struct{}
	stop   chan struct{}
	done   chan struct{}
	tickMu sync.Mutex // one Tick at a time
	closed atomic.Bool
	once   sync.Once

	stats counters
}

// New returns a Store deciding on opts.Remote; it fails when no leaser can
// be found.
func New(opts Options) (*Store, error) {
	if opts.Remote == nil {
		return nil, errors.New("escrow: no remote store")
	}
	ls := opts.Leaser
	if ls == nil {
		r, ok := opts.Remote.(Leaser)
		if !ok {
			return nil, errors.New("escrow: the remote store cannot reserve, and no leaser is given")
		}
		ls = r
	}
	s := &Store{
		remote: opts.Remote, leaser: ls, def: opts.Default,
		lease: opts.Lease, thresh: opts.Threshold, size: opts.Size, shares: opts.Shares, id: opts.ID,
		rebal: opts.Rebalance, maxKeys: opts.MaxKeys, now: opts.Now, log: opts.Logger,
		wake: make(chan struct{}, 1),
	}
	if s.lease <= 0 {
		s.lease = DefaultLease
	}
	if _, ok := ls.(*Region); ok || opts.Regional {
		// A replica's lease comes from its region's Redis: short leases
		// keep the slices short (a slice outlives a lease), and the home
		// counts a slice's hits for its length more than the window.
		s.regional = true
		s.lease = min(s.lease, RegionReplicaLease)
	}
	if s.thresh <= 0 {
		s.thresh = DefaultThreshold
	}
	if s.rebal <= 0 {
		s.rebal = DefaultRebalance
	}
	if s.maxKeys <= 0 {
		s.maxKeys = DefaultMaxKeys
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.id == "" {
		s.id = randomID()
	}
	if s.size == SizeFair && s.shares == nil {
		s.size = SizeDemand
	}
	s.step.Store(int64(s.lease / 4))
	s.callTimeout = max(s.lease, 50*time.Millisecond)
	s.hot.init(s.now())
	s.calls.New = func() any { return new(call) }
	if opts.Run {
		s.stop, s.done = make(chan struct{}), make(chan struct{})
		go s.loop()
	}
	return s, nil
}

// Lease returns the longest lease: a pair's lease is a twentieth of its
// policy's shortest window, up to it (tiers.LeaseFor).
func (s *Store) Lease() time.Duration { return s.lease }

// call is one Decide's scratch.
type call struct {
	plan   store.Plan
	ents   []*entry
	local  []bool // by item: its group is decided from a lease
	takes  []take
	sub    []store.Item
	subOut []tiers.Decision
	idx    []int
}

func (s *Store) getCall(n int) *call {
	c := s.calls.Get().(*call)
	if cap(c.ents) < n {
		c.ents, c.local = make([]*entry, n), make([]bool, n)
	}
	c.ents, c.local = c.ents[:n], c.local[:n]
	clear(c.ents)
	clear(c.local)
	c.takes, c.sub, c.subOut, c.idx = c.takes[:0], c.sub[:0], c.subOut[:0], c.idx[:0]
	return c
}

func (s *Store) putCall(c *call) {
	clear(c.ents)
	clear(c.sub)
	clear(c.takes)
	s.calls.Put(c)
}

var _ store.Store = (*Store)(nil)

// Decide implements store.Store. The groups of items (store.Plan) whose
// pair is in escrow under the item's policy are decided from this
// replica's leases when they hold all the group's hits, or rejected
// locally while the pair's last lease was refused; every other group, the
// refunds, and the groups rejected locally in a request that has groups
// on Remote anyway, are decided by one Remote.Decide. The request stays
// all or nothing: what leases granted is put back when a group on Remote
// is rejected (or Remote fails), and a local rejection puts back the
// request's local grants. A decision from a lease reports the lease's
// view: Remaining is what this replica's leases still hold; it is marked
// Leased (tiers.Decision), as no decision of Remote is.
func (s *Store) Decide(ctx context.Context, now time.Time, items []store.Item, out []tiers.Decision) error {
	if err := store.CheckDecide(s.closed.Load(), items, out); err != nil {
		return err
	}
	rules := s.rules.Load()
	var c *call // only once a pair of the request is in escrow
	for i := range items {
		it := &items[i]
		if it.Refund || !rules.allows(it.Policy, s) {
			continue
		}
		v, ok := s.entries.Load(it.Key)
		if !ok {
			if r := s.hot.add(it.Key); r >= s.thresh && r >= s.hotRate(it.Policy) {
				s.promote(it, now)
			}
			continue
		}
		e := v.(*entry)
		e.decisions.Add(1)
		e.hits.Add(it.Hits)
		if e.pol.Load() != it.Policy {
			// Its leases are of another policy (a reload): this request
			// goes to Remote, and the next tick retires them.
			e.want.Store(it.Policy)
			e.urgent.Store(true)
			continue
		}
		if len(items) == 1 {
			return s.decideOne(ctx, now, e, items, out)
		}
		if c == nil {
			c = s.getCall(len(items))
		}
		c.ents[i] = e
	}
	if c == nil {
		s.stats.remote.Add(uint64(len(items)))
		return s.remote.Decide(ctx, now, items, out)
	}
	defer s.putCall(c)
	c.plan.Make(items)
	rejected, remote, empty := false, false, false
	for i := range items {
		if items[i].Refund {
			remote = true
			continue
		}
		if !c.plan.Leads(i) {
			continue
		}
		e := c.ents[i]
		if e == nil {
			remote = true
			continue
		}
		hits, _ := c.plan.Sums(i)
		d, local, short := e.decide(now, hits, items[i].Policy, &c.takes)
		empty = empty || short
		if !local {
			remote = true
			continue
		}
		out[i] = d
		for j := i; j >= 0; j = c.plan.Next(j) {
			c.local[j] = true
		}
		if !d.OK && !c.plan.Shadow(i) {
			rejected = true
		}
	}
	if empty {
		s.wakeUp()
	}
	if remote && rejected {
		// The request is rejected whatever Remote answers; Remote decides
		// the locally rejected groups too, so that it answers the others
		// as it would in such a request (and applies the refunds).
		for i := range items {
			if c.local[i] && !out[c.plan.Leader(i)].OK {
				c.local[i] = false
			}
		}
		rejected = false
	}
	if !remote {
		if rejected {
			undo(c.takes)
			s.stats.localRejected.Add(uint64(len(items)))
		} else {
			s.stats.localGranted.Add(uint64(len(items)))
		}
		for i := range items {
			if c.plan.Leads(i) {
				store.Split(&c.plan, items, i, out)
			}
		}
		return nil
	}
	// Remote decides the rest, as one request.
	for i := range items {
		if !c.local[i] {
			c.sub = append(c.sub, items[i])
			c.idx = append(c.idx, i)
		}
	}
	if cap(c.subOut) < len(c.sub) {
		c.subOut = make([]tiers.Decision, len(c.sub))
	}
	c.subOut = c.subOut[:len(c.sub)]
	s.stats.remote.Add(uint64(len(c.sub)))
	if err := s.remote.Decide(ctx, now, c.sub, c.subOut); err != nil {
		undo(c.takes)
		return err
	}
	committed := true
	for k, i := range c.idx {
		out[i] = c.subOut[k]
		if !items[i].Refund && !out[i].OK && !c.plan.Shadow(i) {
			committed = false
		}
	}
	if !committed {
		undo(c.takes)
	}
	var local uint64
	for i := range items {
		if c.local[i] {
			local++
			if c.plan.Leads(i) {
				store.Split(&c.plan, items, i, out)
			}
		}
	}
	if committed {
		s.stats.localGranted.Add(local)
	}
	return nil
}

// decideOne is Decide for a request of one item whose pair is in escrow:
// no plan, no scratch, nothing to put back.
func (s *Store) decideOne(ctx context.Context, now time.Time, e *entry, items []store.Item, out []tiers.Decision) error {
	d, local, short := e.decide(now, items[0].Hits, items[0].Policy, nil)
	if short {
		s.wakeUp()
	}
	if !local {
		s.stats.remote.Add(1)
		return s.remote.Decide(ctx, now, items, out)
	}
	if d.OK {
		d.Granted = items[0].Hits
		s.stats.localGranted.Add(1)
	} else {
		s.stats.localRejected.Add(1)
	}
	out[0] = d
	return nil
}

// decide decides a group of hits of e's pair under p at now from its
// leases: granted when they hold the hits (a check of 0 hits when they
// hold any), appending the takes; rejected while the pair's last lease was
// refused; else not local. A local decision is marked Leased (the
// decision log says so). takes, when not nil, records the takes to put
// back. short reports that the leases are short (the next tick is to see
// to them).
func (e *entry) decide(now time.Time, hits int64, p *tiers.Policy, takes *[]take) (d tiers.Decision, local, short bool) {
	e.mu.Lock()
	switch avail := e.avail(now); {
	case hits > 0 && avail >= hits, hits == 0 && avail > 0:
		e.takeHits(now, hits, takes)
		d = tiers.Decision{OK: true, Granted: hits, Tier: 1, Remaining: avail - hits, ResetAfter: e.nextEnd(now), Leased: true}
		local = true
		short = avail-hits < hits
	case hits > 0 && now.Before(e.refusedUntil):
		// A check (0 hits) is granted whatever the count: the shared
		// store answers it.
		d = tiers.Decision{Tier: 1, LimitedByHard: e.hard, LimitedByGlobal: e.global, RetryAfter: e.retryAfter(now), Leased: true}
		d.ResetAfter = d.RetryAfter
		local = true
	default:
		short = true
	}
	e.mu.Unlock()
	if short {
		e.urgent.Store(true)
	}
	if local {
		p.FillLimits(&d)
		d.TierHits = d.TierLimit - d.Remaining
	}
	return d, local, short
}

// nextEnd returns the time until the first live lease ends (when what
// this replica holds changes). e.mu is held.
func (e *entry) nextEnd(now time.Time) time.Duration {
	var end time.Time
	for _, l := range e.leases {
		if l != nil && l.live(now) && (end.IsZero() || l.until.Before(end)) {
			end = l.until
		}
	}
	if end.IsZero() {
		return 0
	}
	return end.Sub(now)
}

// retryAfter is the wait of a request rejected locally at now: until the
// store, which refused a lease asked for at refusedAt, would grant one
// hit with no other traffic (its wait is counted from the lease's last
// instant). e.mu is held.
func (e *entry) retryAfter(now time.Time) time.Duration {
	if e.retry == tiers.Unbounded {
		return tiers.Unbounded
	}
	return max(e.refusedAt.Add(e.lease+e.retry).Sub(now), 0)
}

// hotRate is the decisions per second from which a pair under p is leased:
// the threshold, or minUses per lease when more (but for a region's
// replica: the threshold).
func (s *Store) hotRate(p *tiers.Policy) float64 {
	l, err := tiers.LeaseFor(p, s.lease)
	if err != nil {
		return math.Inf(1)
	}
	if s.regional {
		// A lease from the region's pool costs calls to the region's own
		// Redis; a decision on the shared path, a round trip to the home.
		return s.thresh
	}
	return max(s.thresh, minUses/l.Seconds())
}

// promote puts it's pair in escrow, unless MaxKeys pairs are.
func (s *Store) promote(it *store.Item, now time.Time) {
	if s.nkeys.Load() >= int64(s.maxKeys) {
		s.stats.full.Add(1)
		return
	}
	k := store.Key{Resource: clone(it.Key.Resource), Domain: clone(it.Key.Domain), PolicyID: it.Key.PolicyID}
	// Hot by definition: its rate so far is the threshold, until ticks
	// measure it.
	hot := s.hotRate(it.Policy)
	e := &entry{key: k, share: -1, rate: hot, hitRate: hot, known: true, hot: hot}
	e.pol.Store(it.Policy)
	e.lease, _ = tiers.LeaseFor(it.Policy, s.lease)
	if _, loaded := s.entries.LoadOrStore(k, e); loaded {
		return
	}
	s.nkeys.Add(1)
	s.stats.entered.Add(1)
	s.shorten(e.lease)
	s.log.Debug("escrow: a pair is hot", "resource", k.Resource, "domain", k.Domain)
	s.wakeUp()
}

// shorten makes the loop tick at least every quarter of lease.
func (s *Store) shorten(lease time.Duration) {
	step := int64(max(lease/4, time.Millisecond))
	for {
		old := s.step.Load()
		if old <= step || s.step.CompareAndSwap(old, step) {
			return
		}
	}
}

func clone(s string) string { return string([]byte(s)) }

func (s *Store) wakeUp() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

var _ store.Holder = (*Store)(nil)

// Holding implements store.Holder: what this replica's leases of it's pair
// hold at now, its decision rate, demand and fair share.
func (s *Store) Holding(it *store.Item, now time.Time) (store.Holding, bool) {
	v, ok := s.entries.Load(it.Key)
	if !ok {
		return store.Holding{}, false
	}
	e := v.(*entry)
	e.mu.Lock()
	defer e.mu.Unlock()
	h := store.Holding{Rate: e.shownRate, Demand: e.shownDemand, Share: e.share}
	if s.size != SizeFair {
		h.Share = -1
	}
	for _, l := range e.leases {
		if l != nil && l.live(now) {
			h.Leases++
			h.Held += l.left()
			h.Granted += l.used
			if l.until.After(h.Until) {
				h.Until = l.until
			}
		}
	}
	return h, true
}

var _ store.Reserver = (*Store)(nil)

// Reserve implements store.Reserver on Remote (pacing): a paced request
// waits on the shared state, where this replica's leases count as used.
func (s *Store) Reserve(ctx context.Context, now time.Time, after time.Duration, items []store.Item, out []tiers.Decision) (time.Time, error) {
	rs, ok := s.remote.(store.Reserver)
	if !ok {
		return time.Time{}, store.ErrCannotReserve
	}
	return rs.Reserve(ctx, now, after, items, out)
}

// GiveBack implements store.Reserver on Remote.
func (s *Store) GiveBack(ctx context.Context, now, at time.Time, items []store.Item) error {
	rs, ok := s.remote.(store.Reserver)
	if !ok {
		return store.ErrCannotReserve
	}
	return rs.GiveBack(ctx, now, at, items)
}

var _ store.Inspector = (*Store)(nil)

// Inspect implements store.Inspector on Remote: the shared state, where
// every replica's leases count as used.
func (s *Store) Inspect(ctx context.Context, now time.Time, it *store.Item) (tiers.View, error) {
	in, ok := s.remote.(store.Inspector)
	if !ok {
		return tiers.View{}, store.ErrCannotInspect
	}
	return in.Inspect(ctx, now, it)
}

// Reset implements store.Inspector: this replica's leases of the pair are
// dropped without a give-back (the state they were counted in is gone),
// then Remote forgets the pair. Another replica's lease given back after
// the reset takes back hits counted after it: a reset may grant up to
// the unused part of the leases other replicas hold more.
func (s *Store) Reset(ctx context.Context, it *store.Item) error {
	in, ok := s.remote.(store.Inspector)
	if !ok {
		return store.ErrCannotInspect
	}
	if v, ok := s.entries.Load(it.Key); ok {
		e := v.(*entry)
		e.mu.Lock()
		for i, l := range e.leases {
			if l != nil {
				l.closed = true
				e.leases[i] = nil
			}
		}
		e.history = nil
		e.mu.Unlock()
	}
	return in.Reset(ctx, it)
}

// Close gives back what every lease has not granted (waiting at most a
// second for the leaser) and stops the goroutine; Decide fails with
// store.ErrClosed afterwards. It does not close Remote or the leaser,
// which belong to the caller. Close is idempotent.
func (s *Store) Close() error {
	s.once.Do(func() {
		s.closed.Store(true)
		if s.stop != nil {
			close(s.stop)
			<-s.done
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		s.tickMu.Lock()
		defer s.tickMu.Unlock()
		s.entries.Range(func(_, v any) bool {
			s.retire(ctx, v.(*entry), func(*lease) bool { return true })
			return true
		})
		if s.region != nil {
			s.region.Close()
		}
	})
	return nil
}
