package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/tiers"
)

// Defaults of a request. Its fixed bounds, the same for a charon.v1
// resource, are package descriptors' (MaxEntries, MaxLen).
const (
	DefaultMaxDescriptors = 64
	// DefaultMaxHits bounds the hits of one descriptor.
	DefaultMaxHits = math.MaxUint32
)

// ErrStore is matched (errors.Is) by the error ShouldRateLimit and Request
// return when the store failed; the store's own error is wrapped too. What
// happens when a remote store fails (a local fallback, open, closed,
// unavailable) is the store's business: the engine passes its error on.
var ErrStore = errors.New("engine: store failed")

// ErrNoStore is wrapped, with ErrStore, by the error of a decision asked of an
// Engine without Options.Store.
var ErrNoStore = errors.New("engine: no store")

// Options configure an Engine. The zero value is usable: no store
// (descriptors that no rate limit applies to still work), the system clock,
// 64 descriptors per request.
type Options struct {
	// Store keeps the rate-limit state; the Engine does not own it. Nil:
	// deciding a rate-limited descriptor fails with ErrNoStore.
	Store store.Store
	// Now is the clock, read once per request; nil means time.Now.
	Now func() time.Time
	// MaxDescriptors bounds the descriptors of one request; 0 means
	// DefaultMaxDescriptors.
	MaxDescriptors int
	// MaxHits bounds the hits of one descriptor; 0 means DefaultMaxHits.
	MaxHits uint64
	// OnSetTree, when set, is called by SetTree once the new tree is in
	// force (the Redis backend flushes its over-limit cache, and reaps
	// copy logs only while copy-limited resources are configured).
	OnSetTree func(*descriptors.Tree)
	// QuotaMode puts every limit in quota mode (envoyproxy/ratelimit's
	// QUOTA_MODE), as quota_mode: true does for one, a descriptor's own
	// limit included; as there, every descriptor but an unlimited one is
	// then a quota descriptor, one without a limit (no match, replaced)
	// within, so a request with one is never over by quota alone.
	QuotaMode bool
	// FixedWindowOverrides makes a request's own limit (of one unit) a
	// fixed window, sharing the state of a configured fixed window of the
	// same unit (--fixed-window). As --fixed-window promises
	// envoyproxy/ratelimit's answers, a fixed window that can never grant
	// the request (a limit of 0, more hits than the limit) then answers the
	// rest of its window as duration_until_reset, as there, not never.
	FixedWindowOverrides bool
	// Overdraft makes a request's own limit count post-paid usage
	// (tiers.Policy.Overdraft), as config.Options.OverdraftDefault does for
	// the configured ones (--overdraft).
	Overdraft bool
	// PaceMaxWaiting bounds the requests held at once by pacing (pace: on
	// a descriptor; pace.go); 0 means DefaultPaceMaxWaiting, negative
	// turns pacing off.
	PaceMaxWaiting int
	// PaceMargin is the time a paced request keeps before its caller's
	// deadline; 0 means DefaultPaceMargin.
	PaceMargin time.Duration
	// Sleep holds a paced request for d, returning early with ctx's error
	// when ctx ends; nil means a timer on the wall clock. Tests with an
	// injected Now inject it too.
	Sleep func(ctx context.Context, d time.Duration) error
}

// NoWait is the Sleep of an engine that decides in shadow (a candidate
// configuration, a replay): a paced request is decided as the live engine
// decides it (reserved for its later instant, answered OK) without holding
// anyone, since a shadow answer must never delay the live one and a replay
// runs on the log's clock, not the wall's.
func NoWait(context.Context, time.Duration) error { return nil }

// Engine decides requests. Safe for concurrent use. The zero value is
// New(Options{}).
type Engine struct {
	store    store.Store
	now      func() time.Time
	maxDesc  int
	maxHits  uint64
	tree     atomic.Pointer[descriptors.Tree]
	scratch  sync.Pool
	names    nameCache
	override overrideCache
	once     sync.Once
	// onSetTree is Options.OnSetTree.
	onSetTree func(*descriptors.Tree)
	// quotaAll and fixedOverrides are Options.QuotaMode and
	// FixedWindowOverrides.
	quotaAll, fixedOverrides bool
	// overdraft is Options.Overdraft.
	overdraft bool
	// Pacing: Options.PaceMaxWaiting, PaceMargin and Sleep, and the counts.
	paceMax    int
	paceMargin time.Duration
	sleep      func(ctx context.Context, d time.Duration) error
	paceStats  PaceStats
}

// scratch holds one request's working buffers, reused through a pool.
type scratch struct {
	matches []descriptors.Match
	itemOf  []int
	quotaOf []int           // the item of a descriptor's calendar quota, or -1
	modes   []itemMode      // per item
	pace    []time.Duration // per item: its descriptor's Limit.Pace
	items   []store.Item
	out     []tiers.Decision
	paceOut []tiers.Decision // a reservation's decisions
	buf     []byte
}

// New returns an Engine with opts and no tree (every request is answered OK,
// not limited, until SetTree).
func New(opts Options) *Engine {
	e := &Engine{store: opts.Store, now: opts.Now, maxDesc: opts.MaxDescriptors, maxHits: opts.MaxHits,
		onSetTree: opts.OnSetTree, quotaAll: opts.QuotaMode, fixedOverrides: opts.FixedWindowOverrides, overdraft: opts.Overdraft,
		paceMax: opts.PaceMaxWaiting, paceMargin: opts.PaceMargin, sleep: opts.Sleep}
	e.once.Do(e.defaults)
	return e
}

// defaults fills what Options left out; it also makes the zero Engine
// usable, as New(Options{}).
func (e *Engine) defaults() {
	if e.now == nil {
		e.now = time.Now
	}
	if e.maxDesc <= 0 {
		e.maxDesc = DefaultMaxDescriptors
	}
	if e.maxHits == 0 {
		e.maxHits = DefaultMaxHits
	}
	e.scratch.New = func() any { return new(scratch) }
	if e.paceMax == 0 {
		e.paceMax = DefaultPaceMaxWaiting
	}
	if e.paceMargin <= 0 {
		e.paceMargin = DefaultPaceMargin
	}
	if e.sleep == nil {
		e.sleep = sleepCtx
	}
}

// SetTree swaps in a new descriptor tree atomically; requests in flight
// finish with the tree they started with. A nil tree limits nothing.
func (e *Engine) SetTree(t *descriptors.Tree) {
	e.tree.Store(t)
	e.names.reset()
	if e.onSetTree != nil {
		e.onSetTree(t)
	}
}

// Tree returns the tree in force.
func (e *Engine) Tree() *descriptors.Tree { return e.tree.Load() }

// ShouldRateLimit decides req. Bad input yields a *descriptors.InputError
// naming the field before any state is touched; a store failure an error matching
// ErrStore. The answer is otherwise always OK or OVER_LIMIT.
func (e *Engine) ShouldRateLimit(ctx context.Context, req *Request) (*Response, error) {
	var resp *Response
	switch n := 0; {
	case req != nil && len(req.Descriptors) == 1:
		// The common case in one allocation.
		b := new(struct {
			r Response
			s [1]Status
			l [1]CurrentLimit
		})
		b.r.Statuses, b.r.limits = b.s[:0:1], b.l[:0:1]
		resp = &b.r
	case req != nil && len(req.Descriptors) <= 4:
		// A few descriptors (Envoy's usual actions): one allocation too.
		n = len(req.Descriptors)
		b := new(struct {
			r Response
			s [4]Status
			l [4]CurrentLimit
		})
		b.r.Statuses, b.r.limits = b.s[:0:n], b.l[:0:n]
		resp = &b.r
	default:
		resp = new(Response)
	}
	if err := e.Decide(ctx, req, resp); err != nil {
		return nil, err
	}
	return resp, nil
}

// Decide is ShouldRateLimit writing into resp, reusing its buffers: a
// caller that pools Responses decides without allocating. resp's previous
// contents, and the Limit pointers handed out with them, are overwritten.
func (e *Engine) Decide(ctx context.Context, req *Request, resp *Response) error {
	e.once.Do(e.defaults)
	if err := e.validate(req); err != nil {
		return err
	}
	now := e.now()
	tree := e.tree.Load()
	dc, known := tree.Domain(req.Domain)
	ignore := known && dc.IgnoreLimits
	n := len(req.Descriptors)

	sc := e.scratch.Get().(*scratch)
	defer e.putScratch(sc)
	e.match(tree, req, known, sc)
	sc.itemOf = grow(sc.itemOf, n)
	sc.quotaOf = grow(sc.quotaOf, n)

	sc.items, sc.modes, sc.pace = sc.items[:0], sc.modes[:0], sc.pace[:0]
	for i := range req.Descriptors {
		m := &sc.matches[i]
		sc.itemOf[i], sc.quotaOf[i] = -1, -1
		l := m.Limit
		if l == nil || m.Replaced || l.Unlimited || l.Copies != nil || (m.Policy == nil && l.Quota == nil) {
			// A copy-limited resource is not rate limited: RLS cannot
			// release a hold, so it answers OK, not limited.
			continue
		}
		d := &req.Descriptors[i]
		hits := int64(hitsOf(req, d))
		// A quota descriptor over its limit does not stop the others (it
		// takes part like a shadow item); the request is over when every
		// quota descriptor is.
		mode := e.mode(l, d.Override != nil, ignore)
		if l.Quota != nil {
			// The calendar quota is one more item on its own key, so that
			// store.Apply's all-or-nothing covers it and the rate policy.
			sc.quotaOf[i] = len(sc.items)
			sc.modes = append(sc.modes, mode)
			sc.pace = append(sc.pace, l.Pace)
			sc.items = append(sc.items, store.Item{
				Key:    store.Key{Resource: m.Resource, Domain: m.Domain, PolicyID: l.QuotaID},
				Policy: l.Quota, Hits: hits, Min: hits, Refund: d.Refund,
				Shadow: mode.shadow || mode.quota,
			})
		}
		if m.Policy == nil {
			continue
		}
		sc.itemOf[i] = len(sc.items)
		sc.modes = append(sc.modes, mode)
		sc.pace = append(sc.pace, l.Pace)
		sc.items = append(sc.items, store.Item{
			Key:     store.Key{Resource: m.Resource, Domain: m.Domain, PolicyID: m.Shape},
			Policy:  m.Policy,
			Hits:    hits,
			Min:     hits,
			Refund:  d.Refund,
			SlotsAt: d.SlotsAt,
			Shadow:  mode.shadow || mode.quota,
		})
	}
	sc.out = grow(sc.out, len(sc.items))
	var paced time.Duration
	if len(sc.items) > 0 {
		if err := e.decide(ctx, now, sc.items, sc.out); err != nil {
			return err
		}
		if wait := e.paceWait(ctx, now, sc); wait > 0 {
			// Paced: answered after the wait, with the reservation's
			// decisions, at the instant they were decided for.
			at, waited, err := e.pace(ctx, now, wait, sc)
			if err != nil {
				return err
			}
			if waited {
				now, paced = at, wait
			}
		}
	}

	resp.Code, resp.UnknownDomain, resp.Now, resp.Paced = CodeOK, !known, now, paced
	resp.Slots, resp.SlotsAt = slotsHeld(sc.items, sc.out)
	quotas, quotasOver := 0, 0
	resp.Statuses = grow(resp.Statuses, n)
	if cap(resp.limits) < n {
		resp.limits = make([]CurrentLimit, n)
	}
	resp.limits = resp.limits[:n]
	for i := range resp.Statuses {
		st := &resp.Statuses[i]
		*st = Status{Code: CodeOK, Match: sc.matches[i]}
		k, qk := sc.itemOf[i], sc.quotaOf[i]
		if qk >= 0 {
			st.QuotaDecision = sc.out[qk]
			_, st.PeriodEnd = st.Match.Limit.Quota.Quota.Bounds(now)
			if k < 0 || quotaDecides(&sc.out[k], &sc.out[qk]) {
				k = -1
			}
		}
		if k < 0 && qk >= 0 {
			e.quotaStatus(st, &sc.items[qk], &sc.out[qk], sc.modes[qk], &resp.limits[i], &quotas, &quotasOver, resp)
			continue
		}
		if k < 0 {
			st.Unconfigured = known && st.Match.Limit == nil && dc.AllowUnconfigured
			if l := st.Match.Limit; l != nil && l.Unlimited {
				// envoyproxy/ratelimit's answer for unlimited: all of it,
				// even when another descriptor replaces it (its replaces
				// never drop an unlimited limit).
				st.Remaining = math.MaxUint32
			} else if e.quotaAll {
				// Under global quota mode envoyproxy/ratelimit counts every
				// descriptor but an unlimited one as a quota descriptor,
				// one without a limit (no match, replaced) as within it: a
				// request with such a descriptor is never over by quota.
				quotas++
			}
			continue
		}
		it, d := &sc.items[k], &sc.out[k]
		statusOf(st, ByRate, it, d, sc.modes[k], &quotas, &quotasOver, resp)
		if p := st.Match.Policy; p.Kind == tiers.KindFixedWindow {
			e.fixedAnswer(st, p.Window, now)
		}
		resp.limits[i] = e.currentLimit(&st.Match, d, req.Descriptors[i].Override)
		st.Limit = &resp.limits[i]
	}
	if quotas > 0 && quotasOver == quotas {
		resp.Code = CodeOverLimit
	}
	return nil
}

// slotsHeld is what a request decided as out holds in concurrency limits
// (Response.Slots, SlotsAt): nothing unless its takes were committed
// (store.Apply commits when every take that is neither shadow nor a quota
// descriptor's is granted) and every concurrency take of it took slots,
// else the fewest slots one took and the earliest instant they were
// stamped with. A stream-done refund goes to each of them: one that took
// nothing (a shadow limit over its slots, a check of 0 hits) would give
// back another request's slot; the fewest, so that it never gives back more
// than one took; the earliest, so that it never gives back a slot newer
// than one of theirs (tiers.RefundSlots). What is not given back frees
// itself at its ttl.
func slotsHeld(items []store.Item, out []tiers.Decision) (int64, time.Time) {
	var n int64
	var at time.Time
	for i := range items {
		it, d := &items[i], &out[i]
		if !it.Refund && !it.Shadow && !d.OK {
			return 0, time.Time{}
		}
		if it.Refund || !it.Policy.Concurrency {
			continue
		}
		if !d.OK || d.Granted == 0 || d.SlotsAt.IsZero() {
			return 0, time.Time{}
		}
		if n == 0 || d.Granted < n {
			n = d.Granted
		}
		if at.IsZero() || d.SlotsAt.Before(at) {
			at = d.SlotsAt
		}
	}
	if at.IsZero() {
		return 0, time.Time{}
	}
	return n, at
}

// quotaDecides reports whether a descriptor's answer is its quota's
// decision q rather than its rate policy's r: the one that rejected (the
// longer wait when both did), else the one with fewer hits remaining.
func quotaDecides(r, q *tiers.Decision) bool {
	switch {
	case !q.OK && !r.OK:
		return q.RetryAfter >= r.RetryAfter
	case !q.OK || !r.OK:
		return !q.OK
	}
	return q.Remaining < r.Remaining
}

// quotaStatus answers st with its calendar quota's decision d (item it).
func (e *Engine) quotaStatus(st *Status, it *store.Item, d *tiers.Decision, mode itemMode, cl *CurrentLimit, quotas, quotasOver *int, resp *Response) {
	statusOf(st, ByQuota, it, d, mode, quotas, quotasOver, resp)
	*cl = quotaLimit(&it.Policy.Quota)
	st.Limit = cl
}

// statusOf is the one status rule: st answers with decision d of item it,
// made by by, as mode says; quotas and quotasOver count the quota
// descriptors and those over, and an over-limit descriptor outside quota
// and shadow modes makes resp over limit.
func statusOf(st *Status, by LimitKind, it *store.Item, d *tiers.Decision, mode itemMode, quotas, quotasOver *int, resp *Response) {
	st.Decision, st.By = *d, by
	st.Quota = mode.quota
	if mode.quota {
		*quotas++
	}
	switch {
	case d.OK || it.Refund:
	case mode.shadow:
		// Shadow mode answers OK first, as envoyproxy/ratelimit's
		// limiter does: a shadow quota descriptor is never over.
		st.Shadow = true
	case mode.quota:
		st.Code = CodeOverLimit
		*quotasOver++
	default:
		st.Code, resp.Code = CodeOverLimit, CodeOverLimit
	}
	st.Remaining = uint32(min(max(d.Remaining, 0), math.MaxUint32))
	st.ResetAfter = d.ResetAfter
	if !d.OK {
		st.ResetAfter = d.RetryAfter
	}
}

// itemMode is how a rate-limited descriptor's rejection is answered.
type itemMode struct {
	// shadow: answered OK (shadow_mode, or the domain's ignore_limits).
	shadow bool
	// quota: the descriptor is OVER_LIMIT, the request only when every
	// quota descriptor of it is.
	quota bool
}

// mode is the itemMode of a descriptor limited by l; own: by its own limit
// (RateLimitOverride), which, as in envoyproxy/ratelimit, has neither
// shadow_mode nor quota_mode, though global quota mode (Options.QuotaMode)
// applies to it.
func (e *Engine) mode(l *descriptors.Limit, own, ignore bool) itemMode {
	return itemMode{
		shadow: ignore || (l.ShadowMode && !own),
		quota:  !ignore && (e.quotaAll || (l.QuotaMode && !own)),
	}
}

// match sets sc.matches to the matches of req's descriptors in tree
// (known: req.Domain is one of its domains), requests' own limits and
// replaces applied.
func (e *Engine) match(tree *descriptors.Tree, req *Request, known bool, sc *scratch) {
	sc.matches = grow(sc.matches, len(req.Descriptors))
	replaces := false
	var cal *descriptors.DomainConfig
	for i := range req.Descriptors {
		d := &req.Descriptors[i]
		m, ok := tree.Match(req.Domain, d.Entries)
		if !ok {
			m = descriptors.Match{}
		}
		if d.Override != nil && known {
			// envoyproxy/ratelimit's rule: a descriptor's own limit replaces
			// the configured one, for any descriptor of a known domain. Its
			// units follow the domain's calendar units.
			if cal == nil {
				cal, _ = tree.Domain(req.Domain)
			}
			sc.buf = e.overrideMatch(sc.buf[:0], req.Domain, cal.CalendarUnits, d, &m, ok)
		} else if ok && len(m.Limit.Replaces) > 0 {
			replaces = true
		}
		sc.matches[i] = m
	}
	if replaces {
		descriptors.ApplyReplaces(sc.matches)
	}
}

// decide runs the store on items; its error matches ErrStore.
func (e *Engine) decide(ctx context.Context, now time.Time, items []store.Item, out []tiers.Decision) error {
	if e.store == nil {
		return fmt.Errorf("%w: %w", ErrStore, ErrNoStore)
	}
	if err := e.store.Decide(ctx, now, items, out); err != nil {
		return fmt.Errorf("%w: %w", ErrStore, err)
	}
	return nil
}

func (e *Engine) putScratch(sc *scratch) {
	clear(sc.matches)
	clear(sc.items)
	if cap(sc.buf) > 64<<10 {
		sc.buf = nil
	}
	e.scratch.Put(sc)
}

// hitsOf is descriptor d's hits: its own when set (0 is a check that
// consumes nothing, as in envoyproxy/ratelimit), else the request's (0, its
// unset value, counts as 1).
func hitsOf(req *Request, d *Descriptor) uint64 {
	if d.HasHits {
		return d.Hits
	}
	return max(uint64(req.Hits), 1)
}

// grow returns s with length n, reusing its array when large enough.
func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}
