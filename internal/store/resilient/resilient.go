package resilient

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/tiers"
)

// Defaults of Options.
const (
	DefaultTimeout          = 100 * time.Millisecond
	DefaultMargin           = 2 * time.Millisecond
	DefaultMarginShare      = 0.25
	DefaultFailureThreshold = 5
	DefaultFailureRate      = 0.5
	DefaultRateMinCalls     = 20
	DefaultRateWindow       = time.Second
	DefaultCoolOff          = time.Second
	DefaultCacheSize        = 100_000
	DefaultProbeTimeout     = time.Second
)

// Options configure a Store. The zero value is usable: ModeLocal, the
// defaults above, the system clock.
type Options struct {
	// Mode is what to do when the remote fails or the breaker is open.
	Mode Mode
	// Timeout bounds a remote call whose caller's context has no deadline;
	// 0 means DefaultTimeout, negative means none. A caller with a deadline
	// (Envoy sends 20 ms, a direct caller may allow seconds) has the remote
	// wait until the margin before it, so a burst that queues calls inside
	// the process does not send them to the failure mode while the remote
	// still answers in time.
	Timeout time.Duration
	// Margin and MarginShare keep time before the caller's deadline for the
	// failure mode to answer: the remote call's deadline is the caller's
	// minus the larger of Margin and MarginShare of the time left (Envoy's
	// 20 ms: the remote gets 15 ms, the failure mode 5 ms). The share is
	// what holds on a loaded machine, where the goroutine that answers may
	// wait several milliseconds for a core after the remote's deadline;
	// Margin is its floor for short deadlines. A caller with less than
	// Margin left is answered by the failure mode at once. 0 means
	// DefaultMargin and DefaultMarginShare; a negative MarginShare keeps
	// Margin alone.
	Margin      time.Duration
	MarginShare float64
	// FailureThreshold is the number of consecutive remote failures that
	// opens the breaker; 0 means DefaultFailureThreshold.
	FailureThreshold int
	// FailureRate, in (0, 1], opens the breaker when at least that share of
	// the remote calls of the current RateWindow failed, once the window
	// holds RateMinCalls calls; 0 means DefaultFailureRate, negative turns
	// the rate off (only consecutive failures count).
	FailureRate float64
	// RateMinCalls is the number of calls a window needs before its failure
	// rate counts; 0 means DefaultRateMinCalls.
	RateMinCalls int
	// RateWindow is the length of the failure-rate window; 0 means
	// DefaultRateWindow.
	RateWindow time.Duration
	// CoolOff is how long the breaker stays open before Probe pings the
	// remote; 0 means DefaultCoolOff.
	CoolOff time.Duration
	// ProbeTimeout bounds Probe's ping; 0 means DefaultProbeTimeout.
	ProbeTimeout time.Duration
	// CacheSize bounds the over-limit cache's entries; 0 means
	// DefaultCacheSize, negative turns the cache off.
	CacheSize int
	// DebtInterval is how long the cache sums the refused hits of a
	// post-paid pair in debt before it sends them, in one call per pair;
	// 0 means DefaultDebtInterval, negative sends every refused request's
	// hits at once (as without the cache). Another process may see the
	// smaller debt for that long and one remote call more.
	DebtInterval time.Duration
	// Local configures the in-memory store of ModeLocal (unused otherwise).
	Local memstore.Options
	// Now is the breaker's clock; nil means time.Now. Decisions and the
	// cache use the now passed to Decide.
	Now func() time.Time
	// OnBreakerChange, when set, is called on every breaker transition,
	// in order, with the new state. It runs on the deciding goroutine with
	// a lock held: it must be quick and must not call Decide. A server uses
	// it to set its gRPC health (see Serving).
	OnBreakerChange func(BreakerState)
}

// Store is a store.Store over a remote store with a deadline, a circuit
// breaker, a failure mode and an over-limit cache. Safe for concurrent use;
// create it with New.
type Store struct {
	remote  Remote
	local   *memstore.Store // ModeLocal only
	probeTO time.Duration
	mode    Mode
	timeout time.Duration
	margin  time.Duration
	share   float64 // of the time left kept before the caller's deadline
	replies Replier // the remote, when it counts its replies
	// releaser is the remote, when its waiting calls can be released
	// (the breaker's opening does).
	releaser Releaser
	cooloff  time.Duration
	now      func() time.Time
	// br is the breaker of the whole remote; a Sharder's calls answer to
	// their shards' breakers instead (shards), br only when it names
	// none.
	br      breaker
	sharder Sharder
	shards  shardSet
	// shardReplies is the Sharder, when it counts its replies per shard.
	shardReplies ShardReplier
	cache        *cache // nil: off
	debts        *debts // nil: post-paid hits go to the remote with their request
	// shares divides ModeLocal's limits among the replicas (SetReplicas).
	shares shares

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error

	remoteCalls, cached, localCalls, openCalls, closedCalls, unavailCalls atomic.Uint64
	remoteErrors, timeouts, slow, notSent, stuck                          atomic.Uint64
}

var _ store.Store = (*Store)(nil)

// ErrNoRemote is the remote failure of a Store created with a nil remote.
var ErrNoRemote = errors.New("resilient: no remote store")

// Remote is the store a Store protects (the Redis store): it decides, and it
// can check its health without deciding anything (PING), which is how the
// breaker learns that it is back.
type Remote interface {
	store.Store
	Ping(ctx context.Context) error
}

// New returns a Store deciding through remote, which it owns: Close closes
// it. In ModeLocal it creates its in-memory fallback store. A nil remote
// fails every call and every ping with ErrNoRemote.
func New(remote Remote, opts Options) *Store {
	if remote == nil {
		remote = noRemote{}
	}
	s := &Store{remote: remote, mode: opts.Mode, timeout: opts.Timeout, cooloff: opts.CoolOff, now: opts.Now}
	s.replies, _ = remote.(Replier)
	s.releaser, _ = remote.(Releaser)
	s.sharder, _ = remote.(Sharder)
	s.shardReplies, _ = remote.(ShardReplier)
	if s.timeout == 0 {
		s.timeout = DefaultTimeout
	}
	s.margin = opts.Margin
	if s.margin <= 0 {
		s.margin = DefaultMargin
	}
	switch s.share = opts.MarginShare; {
	case s.share == 0:
		s.share = DefaultMarginShare
	case s.share < 0:
		s.share = 0
	case s.share > 1:
		s.share = 1
	}
	if s.cooloff <= 0 {
		s.cooloff = DefaultCoolOff
	}
	s.probeTO = opts.ProbeTimeout
	if s.probeTO <= 0 {
		s.probeTO = DefaultProbeTimeout
	}
	if s.now == nil {
		s.now = time.Now
	}
	b := &s.br
	b.threshold = int64(opts.FailureThreshold)
	if b.threshold <= 0 {
		b.threshold = DefaultFailureThreshold
	}
	switch r := opts.FailureRate; {
	case r == 0:
		b.rate = DefaultFailureRate
	case r > 0:
		b.rate = min(r, 1)
	}
	b.minCalls = int64(opts.RateMinCalls)
	if b.minCalls <= 0 {
		b.minCalls = DefaultRateMinCalls
	}
	b.window = int64(opts.RateWindow)
	if b.window <= 0 {
		b.window = int64(DefaultRateWindow)
	}
	b.cooloff = int64(s.cooloff)
	b.onChange = opts.OnBreakerChange
	b.winStart.Store(s.now().UnixNano())
	switch size := opts.CacheSize; {
	case size == 0:
		s.cache = newCache(DefaultCacheSize)
	case size > 0:
		s.cache = newCache(size)
	}
	if s.cache != nil && opts.DebtInterval >= 0 {
		s.debts = newDebts(cmp.Or(opts.DebtInterval, DefaultDebtInterval))
		s.debts.flush = s.flushDebts
	}
	if s.mode == ModeLocal {
		s.local = memstore.New(opts.Local)
	}
	return s
}

// Decide implements store.Store. It answers from the over-limit cache when it
// can, else asks the remote under the deadline, else (remote failed, breaker
// open) answers as the failure mode says. Only ModeUnavailable returns an
// error for a failed remote; every mode returns store.ErrClosed after Close,
// an error wrapping store.ErrBadItem for bad items, and the caller's context
// error when the caller gave up (canceled) before the remote answered.
func (s *Store) Decide(ctx context.Context, now time.Time, items []store.Item, out []tiers.Decision) error {
	if err := store.CheckDecide(s.closed.Load(), items, out); err != nil || len(items) == 0 {
		return err
	}
	var epoch uint64
	var plan *store.Plan
	refunds := false
	if s.cache != nil {
		epoch = s.cache.epoch.Load()
		plan = s.cache.plan(items)
		defer s.cache.putPlan(plan)
		if refunds = hasRefund(items); refunds {
			s.cache.forgetRefunds(items)
		} else if s.cache.lookup(now, plan, items, out, s.debts != nil) {
			s.cached.Add(1)
			if s.debts != nil {
				s.debts.add(now, plan, items)
			}
			return nil
		}
	}
	var one [1]*breaker
	brs := s.route(ctx, items, one[:0])
	if !allClosed(brs) {
		// Only Probe closes a breaker again.
		return s.fallback(ctx, now, items, out, brs, ErrBreakerOpen)
	}
	// sharded: the call answers to shards' breakers (a Cluster's masters),
	// not the whole remote's.
	sharded := brs[0] != &s.br
	answers := s.answersOf(brs)
	err := s.callRemote(ctx, now, items, out)
	switch {
	case err == nil:
		s.succeeded(brs, true)
		s.remoteCalls.Add(1)
		if s.cache != nil {
			if refunds {
				// Forget again what a concurrent call may have cached
				// from an answer the refund came after.
				s.cache.forgetRefunds(items)
			}
			s.cache.insert(epoch, now, plan, items, out)
		}
		return nil
	case errors.Is(err, store.ErrBadItem):
		// The remote answered; the items are at fault.
		s.succeeded(brs, false)
		return err
	case errors.Is(err, store.ErrReplied):
		// The remote answered with an error about this call's data (a
		// corrupted state, say): it is up, so the breaker hears of an
		// answer, and the failure mode decides this call alone.
		s.succeeded(brs, true)
		s.remoteErrors.Add(1)
		return s.fallback(ctx, now, items, out, brs, err)
	case errors.Is(ctx.Err(), context.Canceled):
		// The caller went away: nothing is known about the remote.
		return fmt.Errorf("resilient: %w", err)
	case errors.Is(err, store.ErrReleased):
		// The breaker opened while this call waited (Releaser): the
		// failure that opened it was counted.
		return s.fallback(ctx, now, items, out, brs, err)
	case errors.Is(err, store.ErrNotSent):
		s.notSent.Add(1)
		if !errors.Is(err, store.ErrStuck) || sharded {
			// The deadline passed while the call was queued in this
			// process: work beyond what the remote takes, not a remote
			// failure. (With shards, the calls it waited behind may
			// have been another shard's: not this shard's evidence.)
			return s.fallback(ctx, now, items, out, brs, err)
		}
		// Queued behind calls the remote has not answered: its silence
		// held this call as it holds a call that times out, and counts
		// as such (unless the remote answered meanwhile), so that a
		// remote that stopped answering opens the breaker in the first
		// deadline of calls, not only on the few calls of the batch in
		// flight.
		s.stuck.Add(1)
	}
	s.remoteErrors.Add(1)
	if errors.Is(err, context.DeadlineExceeded) {
		s.timeouts.Add(1)
		if s.answersOf(brs) != answers {
			// The remote (the call's shards) answered other calls
			// meanwhile: it is up and busy. Only timeouts while nothing
			// comes back open the breaker.
			s.slow.Add(1)
			return s.fallback(ctx, now, items, out, brs, err)
		}
	}
	t := s.now().UnixNano()
	opened := false
	for _, b := range brs {
		opened = b.failure(t) || opened
	}
	if opened && s.releaser != nil && !sharded {
		// The calls still waiting for the remote get the failure mode's
		// answer now, as the calls after them do, not at their deadlines.
		// (Not with shards: the calls waiting may be the live shards'.)
		s.releaser.Release()
	}
	return s.fallback(ctx, now, items, out, brs, err)
}

// succeeded tells brs of an answer of the remote; answered counts it as
// evidence that their parts are up (for the timeouts of other calls).
func (s *Store) succeeded(brs []*breaker, answered bool) {
	t := s.now().UnixNano()
	for _, b := range brs {
		if answered {
			b.answers.Add(1)
		}
		b.success(t)
	}
}

// Releaser is implemented by a remote whose waiting calls can be told to
// stop waiting: the Redis store's calls queued behind, or sent in, a batch
// Redis has not answered. When the breaker opens the wrapper releases
// them, and they return an error wrapping store.ErrReleased, which the
// failure mode answers at once. The remote keeps what it needs to give
// back what a released call was granted.
type Releaser interface {
	Release()
}

// Replier is implemented by a remote that counts the replies it read,
// those whose callers had given up included (a reply that came after its
// caller's deadline is evidence that the remote is up, which that caller
// did not see).
type Replier interface {
	Replies() uint64
}

// callRemote asks the remote until the margin before the caller's deadline
// (remoteDeadline), or for Timeout when the caller has none.
func (s *Store) callRemote(ctx context.Context, now time.Time, items []store.Item, out []tiers.Decision) error {
	ctx, cancel := s.remoteContext(ctx)
	defer cancel()
	return s.remote.Decide(ctx, now, items, out)
}

// remoteContext is ctx with the deadline of a remote call: the margin
// before the caller's deadline (remoteDeadline), or Timeout when the
// caller has none.
func (s *Store) remoteContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if d, ok := ctx.Deadline(); ok {
		return context.WithDeadline(ctx, s.remoteDeadline(d, time.Now()))
	}
	if s.timeout > 0 {
		return context.WithTimeout(ctx, s.timeout)
	}
	return ctx, func() {}
}

// remoteDeadline is the deadline of a remote call whose caller's deadline is
// d, at instant t: d less the larger of the margin and its share of the
// time left.
func (s *Store) remoteDeadline(d, t time.Time) time.Time {
	left := d.Sub(t)
	return d.Add(-max(s.margin, time.Duration(s.share*float64(left))))
}

// fallback decides items as the failure mode says; cause is why the remote
// was not used, brs the breakers of the call (ModeClosed's wait is the
// longest cool-off left).
func (s *Store) fallback(ctx context.Context, now time.Time, items []store.Item, out []tiers.Decision, brs []*breaker, cause error) error {
	switch s.mode {
	case ModeLocal:
		s.localCalls.Add(1)
		var buf [8]store.Item
		return s.local.Decide(ctx, now, s.shares.items(items, buf[:0]), out)
	case ModeOpen:
		s.openCalls.Add(1)
		for i := range items {
			d := fresh(&items[i], now)
			d.OK, d.RetryAfter, d.LimitedByHard, d.LimitedByGlobal = true, 0, false, false
			if d.ResetAfter == tiers.Unbounded {
				d.ResetAfter = 0
			}
			d.Granted = items[i].Hits
			if items[i].Refund {
				d.Granted = 0
			}
			out[i] = d
		}
		return nil
	case ModeClosed:
		s.closedCalls.Add(1)
		wait := time.Duration(retryInOf(brs, s.now().UnixNano()))
		if wait <= 0 {
			wait = s.cooloff
		}
		wait = max(wait.Truncate(time.Microsecond), time.Microsecond)
		for i := range items {
			d := fresh(&items[i], now)
			d.Granted = 0
			if items[i].Refund {
				d.OK = true
			} else {
				d.OK, d.Remaining, d.RetryAfter, d.ResetAfter = false, 0, wait, wait
			}
			out[i] = d
		}
		return nil
	}
	s.unavailCalls.Add(1)
	return fmt.Errorf("%w: %w", ErrUnavailable, cause)
}

// fresh is the decision context of it's pair with no history: the best the
// wrapper knows without the remote.
func fresh(it *store.Item, now time.Time) tiers.Decision {
	var st tiers.State
	var g tiers.Global
	gp := &g
	if it.Policy.GlobalLimit == 0 {
		gp = nil
	}
	return tiers.Peek(it.Policy, &st, gp, now, it.Hits, 1)
}

// Close closes the remote and the local store; Decide fails with
// store.ErrClosed afterwards. Close is idempotent and returns the remote's
// error.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		s.closeDebts()
		s.closeErr = s.remote.Close()
		if s.local != nil {
			s.local.Close()
		}
	})
	return s.closeErr
}

// Flush empties the over-limit cache, and forgets the local failure
// mode's shares of the policies; a server calls it when the configuration
// changes. Answers of calls in flight are not cached.
func (s *Store) Flush() {
	if s.cache != nil {
		s.cache.flush()
	}
	s.shares.forget()
}

// SetReplicas tells the store how many replicas share the remote, itself
// included, as its owner last counted them while the remote answered. In
// ModeLocal, every limit the local store decides by is then divided among
// them (SharePolicy: each replica's share, rounded down, at least 1), so
// that the replicas together stay within the limit while the remote is
// away; the count last set before an outage is the one used during it.
// A count below 2 (the zero value: never counted) keeps whole limits.
// Safe for concurrent use, and quick: each policy's share is made on
// first use under a new count.
func (s *Store) SetReplicas(n int) { s.shares.set(int64(n)) }

// Serving reports whether the wrapper answers requests: false after Close,
// and in ModeUnavailable while the breaker is not closed (the remote is
// down) or, with shards (Sharder), while every shard's is open; true
// otherwise: one dead Cluster master leaves the others' calls served. A
// server maps it to gRPC health SERVING or NOT_SERVING.
func (s *Store) Serving() bool {
	if s.closed.Load() {
		return false
	}
	if s.mode != ModeUnavailable {
		return true
	}
	if !s.br.closed() {
		return false
	}
	s.shards.mu.RLock()
	defer s.shards.mu.RUnlock()
	if len(s.shards.m) == 0 {
		return true
	}
	for _, b := range s.shards.m {
		if b.closed() {
			return true
		}
	}
	return false
}

// Probe lets the store recover: when the breaker is open and its cool-off
// is over, Probe pings the remote under Options.ProbeTimeout, at most
// MaxProbes pings at a time, and a ping that succeeds closes the breaker;
// it returns the ping's error. Calls of Probe may overlap: a ping that
// hangs (a remote that swallows bytes) does not hold back the next, which
// finds the remote back as soon as it is. A failed ping leaves the breaker open with no new cool-off (and no
// opening counted), so the next Probe pings again. Probe does nothing and
// returns nil otherwise. Decisions never probe: a decision's deadline
// (Options.Timeout) is short, and a remote that has just come back may need
// longer for its first answer (a new connection, a Redis that must load its
// function again), which a decision used as the probe would time out on,
// keeping the breaker open while the remote is healthy. The owner calls
// Probe every Options.CoolOff/10 or so, so recovery follows the remote's
// return by about that interval. With shards (Sharder) each open shard's
// breaker is probed on its own (PingShard), and the breakers of shards the
// remote no longer names are forgotten.
func (s *Store) Probe(ctx context.Context) error {
	if s.closed.Load() {
		return nil
	}
	var err error
	if s.sharder != nil {
		err = s.probeShards(ctx)
	}
	if s.br.closed() || s.br.retryIn(s.now().UnixNano()) > 0 {
		return err
	}
	if !s.br.startProbe() {
		return err
	}
	defer s.br.endProbe()
	ctx, cancel := context.WithTimeout(ctx, s.probeTO)
	defer cancel()
	err = s.remote.Ping(ctx)
	switch {
	case err == nil:
		s.br.close(s.now().UnixNano())
	case errors.Is(ctx.Err(), context.Canceled):
	default:
		s.remoteErrors.Add(1)
	}
	return err
}

// Settler is implemented by a remote whose calls leave work pending after
// they return: the Redis store reads the replies of calls whose callers
// gave up, and gives back what they granted.
type Settler interface {
	Settle(ctx context.Context) error
}

// Settle sends the refused hits of post-paid pairs in debt summed so far
// (Options.DebtInterval), then returns once the remote has nothing pending
// (a Settler's Settle), at once for a remote that is not a Settler, or with
// ctx's error. The wrapper leaves nothing else pending: the failure mode
// answers before Decide returns. A test calls it, after stopping its
// calls, to wait for the store instead of for a duration.
func (s *Store) Settle(ctx context.Context) error {
	s.settleDebts()
	if st, ok := s.remote.(Settler); ok {
		return st.Settle(ctx)
	}
	return nil
}

// Mode returns the failure mode.
func (s *Store) Mode() Mode { return s.mode }

// Stats are the wrapper's counters since New, for metrics. Every call of
// Decide that did not fail on bad items, a closed store or its caller's
// cancellation is counted once, in exactly one of Remote, Cached, Local,
// Open, Closed and Unavailable.
type Stats struct {
	// Remote counts calls the remote store decided.
	Remote uint64
	// Cached counts calls answered from the over-limit cache (CacheHits).
	Cached uint64
	// Local, Open, Closed and Unavailable count calls answered by each
	// failure mode (only the configured mode's counter moves).
	Local, Open, Closed, Unavailable uint64
	// RemoteErrors counts failed remote calls and failed probe pings,
	// Timeouts the calls among them that hit the deadline, Slow those
	// timeouts while the remote answered other calls (not counted against
	// the breaker). Calls and pings the caller canceled are not counted,
	// nor calls released when the breaker opened (Releaser).
	RemoteErrors, Timeouts, Slow uint64
	// NotSent counts calls whose deadline passed while they were queued in
	// this process, before reaching the remote (answered by the failure
	// mode). Stuck counts those among them that waited behind calls the
	// remote had not answered (store.ErrStuck): they are counted as
	// timeouts too (RemoteErrors, Timeouts, Slow) and by the breaker as
	// timeouts are; the others are not counted against the breaker nor in
	// RemoteErrors.
	NotSent, Stuck uint64
	// Breaker is the breaker's state now, BreakerOpens how many times it
	// opened; with shards (Sharder), open while any shard's is, and the
	// openings of them all. Shards are the shards' breakers, by name.
	Breaker      BreakerState
	BreakerOpens uint64
	Shards       []ShardStats
	// CacheHits and CacheMisses count calls without refunds that were and
	// were not answered from the cache; CacheSize is its entries now,
	// CacheEvictions how many were evicted to respect Options.CacheSize.
	CacheHits, CacheMisses uint64
	CacheSize              int
	CacheEvictions         uint64
	// Replicas is the count of replicas sharing the remote last set
	// (SetReplicas; 0: never), by which ModeLocal divides every limit.
	Replicas int64
	// DebtDeferred counts the calls answered from the cache whose
	// post-paid hits were summed to be sent later (Options.DebtInterval);
	// DebtFlushes the remote calls that sent such sums (one per pair per
	// flush), DebtFlushErrors those that failed.
	DebtDeferred, DebtFlushes, DebtFlushErrors uint64
}

// Stats returns the counters. Safe for concurrent use; the fields are read
// one by one, not as one snapshot.
func (s *Store) Stats() Stats {
	st := Stats{
		Remote:       s.remoteCalls.Load(),
		Cached:       s.cached.Load(),
		Local:        s.localCalls.Load(),
		Open:         s.openCalls.Load(),
		Closed:       s.closedCalls.Load(),
		Unavailable:  s.unavailCalls.Load(),
		RemoteErrors: s.remoteErrors.Load(),
		Timeouts:     s.timeouts.Load(),
		Slow:         s.slow.Load(),
		NotSent:      s.notSent.Load(),
		Stuck:        s.stuck.Load(),
		Shards:       s.shardStats(),
		Replicas:     s.shares.n.Load(),
	}
	// The whole: open while any breaker is, opened as often as they all.
	st.Breaker, st.BreakerOpens = BreakerState(s.br.state.Load()), s.br.opens.Load()
	for _, sh := range st.Shards {
		st.BreakerOpens += sh.BreakerOpens
		if sh.Breaker == BreakerOpen {
			st.Breaker = BreakerOpen
		}
	}
	if c := s.cache; c != nil {
		st.CacheHits, st.CacheMisses = c.hits.Load(), c.misses.Load()
		st.CacheSize = c.size()
		st.CacheEvictions = c.evictions.Load()
	}
	if d := s.debts; d != nil {
		st.DebtDeferred, st.DebtFlushes, st.DebtFlushErrors = d.deferred.Load(), d.flushes.Load(), d.flushErrors.Load()
	}
	return st
}

type noRemote struct{}

func (noRemote) Decide(context.Context, time.Time, []store.Item, []tiers.Decision) error {
	return ErrNoRemote
}

func (noRemote) Ping(context.Context) error { return ErrNoRemote }

func (noRemote) Close() error { return nil }

var _ store.Inspector = (*Store)(nil)

// Inspect implements store.Inspector by asking the remote (under Timeout
// when ctx has no deadline), whatever the breaker's state: an operator
// asking sees what Redis holds, or the error. A remote that is not an
// Inspector returns store.ErrCannotInspect.
func (s *Store) Inspect(ctx context.Context, now time.Time, it *store.Item) (tiers.View, error) {
	in, ok := s.remote.(store.Inspector)
	if !ok {
		return tiers.View{}, store.ErrCannotInspect
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return in.Inspect(ctx, now, it)
}

// Reset implements store.Inspector: it resets the pair on the remote, then
// forgets its over-limit cache entry and its local fallback state.
func (s *Store) Reset(ctx context.Context, it *store.Item) error {
	in, ok := s.remote.(store.Inspector)
	if !ok {
		return store.ErrCannotInspect
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	if err := in.Reset(ctx, it); err != nil {
		return err
	}
	if s.cache != nil {
		s.cache.drop(&it.Key)
	}
	if s.local != nil {
		return s.local.Reset(ctx, it)
	}
	return nil
}

var _ store.Reserver = (*Store)(nil)

// Reserve implements store.Reserver by asking the remote, as Decide does
// (until Margin before the caller's deadline), but never from the
// over-limit cache (the answer is at a later instant) and without moving
// the breaker (a reservation is a second call for the same request). When
// the remote cannot answer (breaker open, an error), ModeLocal reserves on
// the local store; the other modes return the error, and the request is
// answered as first decided. A remote that is not a store.Reserver
// returns store.ErrCannotReserve.
func (s *Store) Reserve(ctx context.Context, now time.Time, after time.Duration, items []store.Item, out []tiers.Decision) (time.Time, error) {
	if err := store.CheckDecide(s.closed.Load(), items, out); err != nil || len(items) == 0 {
		return time.Time{}, err
	}
	rs, ok := s.remote.(store.Reserver)
	if !ok {
		return time.Time{}, store.ErrCannotReserve
	}
	err := ErrBreakerOpen
	var one [1]*breaker
	if allClosed(s.route(ctx, items, one[:0])) {
		var at time.Time
		at, err = s.reserveRemote(ctx, func(ctx context.Context) (time.Time, error) { return rs.Reserve(ctx, now, after, items, out) })
		if err == nil {
			return at, nil
		}
		if errors.Is(err, store.ErrBadItem) || errors.Is(err, store.ErrCannotReserve) || ctx.Err() != nil {
			return time.Time{}, fmt.Errorf("resilient: %w", err)
		}
	}
	if s.mode == ModeLocal {
		var buf [8]store.Item
		return s.local.Reserve(ctx, now, after, s.shares.items(items, buf[:0]), out)
	}
	return time.Time{}, fmt.Errorf("resilient: %w: %w", store.ErrCannotReserve, err)
}

// GiveBack implements store.Reserver: on the remote, where Reserve
// reserved, or on the local store in ModeLocal when the remote cannot
// answer (the reservation may have been local, and giving back what the
// local store never held only ever grants more there, never more than the
// remote).
func (s *Store) GiveBack(ctx context.Context, now, at time.Time, items []store.Item) error {
	rs, ok := s.remote.(store.Reserver)
	if !ok {
		return store.ErrCannotReserve
	}
	if s.cache != nil {
		back, _ := store.GiveBackItems(items)
		s.cache.forgetRefunds(back)
	}
	err := ErrBreakerOpen
	var one [1]*breaker
	if allClosed(s.route(ctx, items, one[:0])) {
		_, err = s.reserveRemote(ctx, func(ctx context.Context) (time.Time, error) { return time.Time{}, rs.GiveBack(ctx, now, at, items) })
		if err == nil || ctx.Err() != nil {
			return err
		}
	}
	if s.mode == ModeLocal {
		var buf [8]store.Item
		return s.local.GiveBack(ctx, now, at, s.shares.items(items, buf[:0]))
	}
	return err
}

// reserveRemote runs f, a call to the remote, under the deadline Decide's
// remote calls get.
func (s *Store) reserveRemote(ctx context.Context, f func(context.Context) (time.Time, error)) (time.Time, error) {
	ctx, cancel := s.remoteContext(ctx)
	defer cancel()
	return f(ctx)
}

// bound gives ctx the Timeout when it has no deadline.
func (s *Store) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok || s.timeout < 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, s.timeout)
}
