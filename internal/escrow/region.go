package escrow

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/charonlimit/charon/internal/collect"
	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/tiers"
)

// DefaultRegionLease is the longest slice a region takes from the home.
const DefaultRegionLease = 10 * time.Second

// RegionReplicaLease is the longest lease of a region's replica (or
// --escrow-lease when shorter): its leases come from the region's Redis,
// and a slice must outlive them.
const RegionReplicaLease = 100 * time.Millisecond

// homeTimeout bounds each call of a Region to the home.
const homeTimeout = 2 * time.Second

// poolMargin is how much earlier than its lease a slice closes on the
// pool's clock: the pool's clock is read in milliseconds.
const poolMargin = 2 * time.Millisecond

// ErrNoSlice is a Region's answer to a lease asked for while its pool
// holds no slice of the pair open long enough: the replica decides on the
// shared path meanwhile, and the Region takes a slice from the home.
var ErrNoSlice = errors.New("escrow: the region holds no slice of this key yet")

// RegionOptions configure a Region. Home and Pool are required.
type RegionOptions struct {
	// Home is the store that holds every global budget (the Redis store
	// at --escrow-home): the region leases its slices from it.
	Home Leaser
	// Pool keeps the region's slices, shared by its replicas (the
	// region's Redis: redisbackend.Backend.EscrowPool).
	Pool Pool
	// Name names the region (logs); ID this replica (the refill lock's
	// owner; default a random name).
	Name, ID string
	// Lease is the longest slice (default DefaultRegionLease): see
	// sliceFor.
	Lease time.Duration
	// Now is the clock (nil: time.Now); Run starts the goroutine that
	// calls Tick (else the caller does).
	Now    func() time.Time
	Run    bool
	Logger *slog.Logger
}

// Region is the leaser of the replicas of one region (SPEC §10,
// regions): they take their leases (sub-leases) from slices of the home's
// budget that the region's Pool keeps, and the Region takes those slices
// from the home with the lease protocol of a replica (leaseCalls.take),
// sized by the region's demand. A decision from a sub-lease never leaves
// the region; the home sees about three calls per region per slice.
//
// Why it is exact: a slice is a lease the home granted, its hits reserved
// at the home for its last instant at and checked at the present; the
// region grants them only from the check's answer until the slice's end,
// which comes no later than at (the end is the pool's clock, read before
// the reservation was sent, plus the slice's length). A sub-lease is taken
// from a slice open at least its length more, so its grants too fall in
// that span, and the hits of the slice are granted at most once: what a
// replica takes from the pool is gone from it, what it gives back goes
// into the slice while it is open and to the home (for the slice's
// instant) once it has closed, and the slice's rest goes back to the home
// when the Region that opened it closes it at its end. A Region that
// dies leaves its slices open until their end; what they hold then stays
// counted at the home until its window forgets it, as a killed replica's
// lease does.
//
// When the home does not answer, the region's replicas decide from the
// slices it holds until they end, then on the shared path (the home,
// behind the failure mode): never from budget the home has not counted.
type Region struct {
	home  leaseCalls
	pool  Pool
	name  string
	id    string
	lease time.Duration
	now   func() time.Time
	log   *slog.Logger

	mu    sync.Mutex
	pairs map[string]*regionPair
	mine  []*openSlice // the slices this Region opened, closed at their end

	stats   counters
	region  regionCounters
	refills sync.WaitGroup // the loop's slices in flight
	wake    chan struct{}
	stop    chan struct{}
	done    chan struct{}
	tickMu  sync.Mutex
	closed  atomic.Bool
	once    sync.Once
}

// regionPair is a pair the region's replicas lease. Guarded by Region.mu.
type regionPair struct {
	key   store.Key
	pol   *tiers.Policy
	need  time.Duration // the replicas' lease length
	want  int64         // the last sub-lease asked for
	asked time.Time     // when
	// own is this replica's demand (hits per second) as its last lease
	// said; rate the region's, the sum its replicas reported.
	own  float64
	rate float64
	// takeDur is how long the last slice took (the home's round trips).
	takeDur   time.Duration
	refilling bool
	// nextTick and nextReport are when the pair's state is read and its
	// demand reported again; urgent, that a replica found no slice.
	nextTick, nextReport time.Time
	urgent               bool
	reported             float64 // the demand last reported
}

// openSlice is a slice this Region opened: closed at end (this process's
// clock), its rest given back to the home for at.
type openSlice struct {
	k   string
	key store.Key
	pol *tiers.Policy
	id  int64
	at  time.Time
	end time.Time
}

type regionCounters struct {
	takes, misses, puts, homePuts, short atomic.Uint64
}

// RegionStats are a Region's counters since NewRegion.
type RegionStats struct {
	// Slices taken from the home and the hits they held; GivenBack the
	// hits given back to the home (a slice's rest at its end, a
	// sub-lease's rest after its slice closed, a check's excess);
	// Refused slices the home refused; Errors calls to the home that
	// failed; HomeCalls every call to the home.
	Slices, SliceHits, GivenBack, Refused, Errors, HomeCalls uint64
	// Takes are sub-leases replicas took from the pool, Misses sub-leases
	// asked for while it held none; Puts sub-lease rests put back into
	// their slice, HomePuts those given to the home (their slice closed);
	// Short slices given back at once because the home's answer left too
	// little of them for a sub-lease.
	Takes, Misses, Puts, HomePuts, Short uint64
}

// NewRegion returns the Region of o.
func NewRegion(o RegionOptions) (*Region, error) {
	if o.Home == nil || o.Pool == nil {
		return nil, errors.New("escrow: a region needs a home store and a pool")
	}
	r := &Region{pool: o.Pool, name: o.Name, id: o.ID, lease: o.Lease, now: o.Now, log: o.Logger,
		pairs: map[string]*regionPair{}, wake: make(chan struct{}, 1)}
	if r.lease <= 0 {
		r.lease = DefaultRegionLease
	}
	if r.now == nil {
		r.now = time.Now
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	if r.id == "" {
		r.id = randomID()
	}
	r.home = leaseCalls{ls: o.Home, timeout: homeTimeout, now: r.now, c: &r.stats, log: r.log}
	if o.Run {
		r.stop, r.done = make(chan struct{}), make(chan struct{})
		go r.loop()
	}
	return r, nil
}

var _ Leaser = (*Region)(nil)

// poolKey names a pair in the pool.
func poolKey(k store.Key) string {
	return k.Domain + "\x00" + k.Resource + "\x00" + strconv.FormatUint(k.PolicyID, 16)
}

// Reserve implements store.Reserver for a replica's lease of after: it
// takes up to the item's hits from the region's slice of the pair that
// stays open at least after more, and returns that slice's instant at the
// home. With no such slice it fails with ErrNoSlice (and the Region takes
// one), or, while the home refuses the pair, answers the refusal.
func (r *Region) Reserve(ctx context.Context, now time.Time, after time.Duration, items []store.Item, out []tiers.Decision) (time.Time, error) {
	if r.closed.Load() {
		return time.Time{}, store.ErrClosed
	}
	if len(items) != 1 || len(out) < 1 || items[0].Hits <= 0 || items[0].Refund {
		return time.Time{}, errors.New("escrow: a region leases one item of hits at a time")
	}
	it := &items[0]
	k := poolKey(it.Key)
	r.mu.Lock()
	p := r.pairs[k]
	if p == nil {
		p = &regionPair{key: it.Key, pol: it.Policy}
		r.pairs[k] = p
	}
	p.pol, p.need, p.want, p.asked = it.Policy, max(p.need, after), it.Hits, now
	// A replica asks for its use over one lease and a quarter more.
	p.own = float64(it.Hits) / max(after.Seconds(), 1e-3) / headroom
	r.mu.Unlock()
	n, id, st, err := r.pool.Take(ctx, k, it.Hits, after+poolMargin)
	if err != nil {
		return time.Time{}, err
	}
	if n > 0 {
		r.region.takes.Add(1)
		out[0] = tiers.Decision{OK: true, Granted: n, Tier: 1}
		return time.Unix(0, id), nil
	}
	if st.Refused > 0 {
		out[0] = tiers.Decision{Tier: 1, RetryAfter: st.Refusal.Retry, LimitedByHard: st.Refusal.Hard, LimitedByGlobal: st.Refusal.Global}
		return time.Time{}, nil
	}
	r.region.misses.Add(1)
	r.mu.Lock()
	p.urgent = true
	r.mu.Unlock()
	r.wakeUp()
	return time.Time{}, ErrNoSlice
}

// GiveBack implements store.Reserver: the rest of a sub-lease goes back
// into its slice while the slice is open, else to the home for the
// slice's instant. A put whose answer is lost gives nothing to the home:
// the hits stay counted, which only grants less.
func (r *Region) GiveBack(ctx context.Context, now, at time.Time, items []store.Item) error {
	var errs []error
	for i := range items {
		it := &items[i]
		ok, err := r.pool.Put(ctx, poolKey(it.Key), at.UnixNano(), it.Hits)
		switch {
		case err != nil:
			errs = append(errs, err)
		case ok:
			r.region.puts.Add(1)
		default:
			r.region.homePuts.Add(1)
			r.home.giveBack(ctx, it.Key, it.Policy, at, it.Hits)
		}
	}
	return errors.Join(errs...)
}

// Decide implements store.Store for a replica's check of a sub-lease: a
// slice was checked at the home before it was opened, so a sub-lease has
// no excess. Only checks (items of 0 hits) are decided.
func (r *Region) Decide(_ context.Context, _ time.Time, items []store.Item, out []tiers.Decision) error {
	for i := range items {
		if items[i].Hits != 0 {
			return errors.New("escrow: a region decides only the checks of its sub-leases")
		}
		out[i] = tiers.Decision{OK: true, Tier: 1}
	}
	return nil
}

func (r *Region) wakeUp() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// loop calls Tick every quarter of the shortest sub-lease (at most every
// eighth of the longest slice), and at once when a replica found no
// slice, until Close.
func (r *Region) loop() {
	defer close(r.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-r.stop
		cancel()
	}()
	t := time.NewTimer(r.step())
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		case <-r.wake:
		}
		r.Tick(ctx)
		t.Reset(r.step())
	}
}

func (r *Region) step() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.lease / 8
	for _, p := range r.pairs {
		s = min(s, p.need/4)
	}
	return max(s, time.Millisecond)
}

// Tick closes the slices this Region opened that have ended, giving their
// rest back to the home; forgets pairs no replica asked for in a while;
// measures each pair's demand on the pool; and takes a slice from the
// home for a pair whose open slices will not cover its demand until a new
// one could arrive. It returns once its calls have.
func (r *Region) Tick(ctx context.Context) {
	r.tickMu.Lock()
	defer r.tickMu.Unlock()
	if r.closed.Load() {
		return
	}
	now := r.now()
	r.closeEnded(ctx, func(s *openSlice) bool { return !now.Before(s.end) })
	r.mu.Lock()
	pairs := make(map[string]*regionPair, len(r.pairs))
	for k, p := range r.pairs {
		if now.Sub(p.asked) > max(4*r.sliceFor(p), 10*time.Second) {
			delete(r.pairs, k)
			continue
		}
		// Each pair every half lease of its replicas, or at once when one
		// found no slice.
		if now.Before(p.nextTick) && !p.urgent {
			continue
		}
		p.urgent, p.nextTick = false, now.Add(max(p.need/2, time.Millisecond))
		pairs[k] = p
	}
	r.mu.Unlock()
	var wg sync.WaitGroup
	sem := make(chan struct{}, parallel)
	for k, p := range pairs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			r.tickPair(ctx, k, p, now)
		}()
	}
	wg.Wait()
}

// sliceFor returns the length of p's next slice. A slice's hits count at
// the home from its reservation until its end plus the window, so every
// hit a region grants counts a slice's length longer than the window: the
// share of the limit a region can grant is about W/(W+L). Slices are
// therefore as short as they can serve: long enough to arrive (the
// home's last answer, takeDur), serve sub-leases for as long again, and
// outlive the last sub-lease (p.need); and at least a fortieth of the
// window, at most r.lease (LeaseFor's twentieth, halved), so that the home
// is not asked more often than a long window needs. Region.mu is held.
func (r *Region) sliceFor(p *regionPair) time.Duration {
	base, err := tiers.LeaseFor(p.pol, 2*r.lease)
	if err != nil {
		base = 2 * r.lease
	}
	return max(base/2, p.need+2*p.takeDur+4*poolMargin)
}

// tickPair reports this replica's demand for k every quarter of the
// demands' ttl (reading the region's), reads the slices open long enough
// to serve, and takes a slice when they run short: two calls to the
// region's Redis at most.
func (r *Region) tickPair(ctx context.Context, k string, p *regionPair, now time.Time) {
	r.mu.Lock()
	own := p.own
	ttl := max(4*p.need, time.Second)
	if now.Sub(p.asked) > ttl {
		own = 0 // no lease asked for lately: its demand is met
	}
	// Again when due, or at once when this replica's demand moved by a
	// quarter (a key growing hot).
	report := !now.Before(p.nextReport) || math.Abs(own-p.reported) > max(own, p.reported)/4
	if report {
		p.nextReport, p.reported = now.Add(ttl/4), own
	}
	lead := p.need + p.takeDur*3/2 + 2*poolMargin
	r.mu.Unlock()
	if report {
		rate, err := r.pool.Report(ctx, k, r.id, own, ttl)
		if err != nil {
			return
		}
		r.mu.Lock()
		p.rate = rate
		r.mu.Unlock()
	}
	_, _, open, err := r.pool.Take(ctx, k, 0, lead)
	if err != nil {
		return
	}
	r.mu.Lock()
	// A new slice takes about takeDur to arrive, and must then serve a
	// sub-lease: the slices open that long more must hold the demand of
	// that span, or the region runs dry. A slice is taken from until its
	// last sub-lease, which ends with it: it serves the demand of its
	// length less its own arrival.
	length := r.sliceFor(p)
	want := int64(math.Ceil(p.rate * (length - p.takeDur).Seconds() * headroom))
	pol, need := p.pol, p.need
	due := !p.refilling && open.Refused <= 0 && p.rate > 0
	short := max(int64(math.Ceil(p.rate*lead.Seconds())), 1)
	r.mu.Unlock()
	if !due || open.Left >= short {
		return
	}
	r.mu.Lock()
	if p.refilling {
		r.mu.Unlock()
		return
	}
	p.refilling = true
	r.mu.Unlock()
	refill := func() {
		defer func() {
			r.mu.Lock()
			p.refilling = false
			r.mu.Unlock()
		}()
		r.refill(ctx, k, p.key, pol, min(max(want, 1), pol.Tiers[0].Limit), length, need, p)
	}
	if r.stop == nil {
		refill() // ticks of the caller's: it returns with its calls
		return
	}
	// The loop's: a slice's round trips to the home do not hold back the
	// ticks of the other pairs (Close waits for it).
	r.refills.Add(1)
	go func() {
		defer r.refills.Done()
		refill()
	}()
}

// refill takes a slice of up to want hits of k for length from the home
// and opens it in the pool, under the pool's refill lock for k (one
// replica of the region takes it).
func (r *Region) refill(ctx context.Context, k string, key store.Key, pol *tiers.Policy, want int64, length, need time.Duration, p *regionPair) {
	ok, err := r.pool.Lock(ctx, k, r.id, 2*r.home.timeout+time.Second)
	if err != nil || !ok {
		return
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = r.pool.Unlock(uctx, k, r.id)
	}()
	// The pool's clock before the reservation is sent: the slice ends at
	// it plus the lease's length, no later than the lease's last instant.
	_, _, st, err := r.pool.Take(ctx, k, 0, 0)
	if err != nil {
		return
	}
	if st.Refused > 0 {
		return // another replica of the region was refused meanwhile
	}
	start := r.now()
	l, refused, l0, ok := r.home.take(ctx, key, pol, want, length)
	took := r.now().Sub(start)
	r.mu.Lock()
	p.takeDur = took
	r.mu.Unlock()
	if !ok {
		return
	}
	if l == nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = r.pool.Refuse(rctx, k, min(max(refused.RetryAfter, time.Millisecond), need),
			Refusal{Retry: refused.RetryAfter, Hard: refused.LimitedByHard, Global: refused.LimitedByGlobal})
		return
	}
	end := st.At.Add(l.until.Sub(l0) - poolMargin)
	closeAt := start.Add(l.until.Sub(l0))
	if r.now().Add(need + poolMargin).After(closeAt) {
		// The home's answers left too little of the slice for one
		// sub-lease: give it back (the next is longer: sliceFor).
		r.region.short.Add(1)
		r.home.giveBack(ctx, key, pol, l.at, l.size)
		return
	}
	id := l.at.UnixNano()
	s := &openSlice{k: k, key: key, pol: pol, id: id, at: l.at, end: closeAt}
	r.mu.Lock()
	r.mine = append(r.mine, s)
	r.mu.Unlock()
	r.stats.leases.Add(1)
	r.stats.leasedHits.Add(uint64(l.size))
	// An Add whose answer is lost may have opened the slice: it is closed
	// at its end like any other, and what it holds then is given back.
	if err := r.pool.Add(ctx, k, id, l.size, end); err != nil {
		r.log.Debug("escrow: a region's slice may not have opened", "region", r.name, "resource", key.Resource, "err", err.Error())
	}
}

// closeEnded closes the slices this Region opened that match, giving what
// they hold back to the home.
func (r *Region) closeEnded(ctx context.Context, match func(*openSlice) bool) {
	r.mu.Lock()
	var ended []*openSlice
	keep := r.mine[:0]
	for _, s := range r.mine {
		if match(s) {
			ended = append(ended, s)
		} else {
			keep = append(keep, s)
		}
	}
	clear(r.mine[len(keep):])
	r.mine = keep
	r.mu.Unlock()
	for _, s := range ended {
		n, err := r.pool.Close(ctx, s.k, s.id)
		if err != nil {
			// It stays open until its end on the pool's clock, then
			// nothing more is taken from it: what it holds stays counted.
			r.stats.giveBackErrors.Add(1)
			continue
		}
		r.home.giveBack(ctx, s.key, s.pol, s.at, n)
	}
}

// Stats returns the Region's counters. Safe for concurrent use.
func (r *Region) Stats() RegionStats {
	c := &r.stats
	return RegionStats{Slices: c.leases.Load(), SliceHits: c.leasedHits.Load(), GivenBack: c.givenBack.Load(),
		Refused: c.leaseRefusals.Load(), Errors: c.leaseErrors.Load() + c.giveBackErrors.Load(), HomeCalls: c.leaseCalls.Load(),
		Takes: r.region.takes.Load(), Misses: r.region.misses.Load(), Puts: r.region.puts.Load(),
		HomePuts: r.region.homePuts.Load(), Short: r.region.short.Load()}
}

// Close stops the goroutine and closes the slices this Region opened,
// giving their rest back to the home (waiting at most a second); Reserve
// fails with store.ErrClosed afterwards. The replicas' stores (escrow.Store)
// close first: they give their sub-leases back into the slices. It does
// not close the home or the pool.
func (r *Region) Close() error {
	r.once.Do(func() {
		r.closed.Store(true)
		if r.stop != nil {
			close(r.stop)
			<-r.done
		}
		r.refills.Wait() // its calls end with the loop's context
		r.tickMu.Lock()
		defer r.tickMu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		r.closeEnded(ctx, func(*openSlice) bool { return true })
	})
	return nil
}

// NewRegionCollector exports a Region's Stats, read at every scrape, as
// charon_escrow_region_*: slices_total, slice_hits_total,
// given_back_hits_total, refused_total, errors_total, home_calls_total,
// takes_total, misses_total, puts_total, home_puts_total, short_total.
func NewRegionCollector(stats func() RegionStats) prometheus.Collector {
	counter := func(name, help string, v func(RegionStats) uint64) collect.Metric[RegionStats] {
		return collect.Metric[RegionStats]{Name: name, Help: help, Counter: true, Value: func(s RegionStats) float64 { return float64(v(s)) }}
	}
	return collect.Collector("charon", "escrow_region", stats,
		counter("slices_total", "Slices of hot keys' budgets this replica took from the home for its region.", func(s RegionStats) uint64 { return s.Slices }),
		counter("slice_hits_total", "Hits the slices held when taken.", func(s RegionStats) uint64 { return s.SliceHits }),
		counter("given_back_hits_total", "Hits given back to the home: a slice's rest at its end, a sub-lease's rest after its slice closed, a check's excess.", func(s RegionStats) uint64 { return s.GivenBack }),
		counter("refused_total", "Slices the home refused: the key was full.", func(s RegionStats) uint64 { return s.Refused }),
		counter("errors_total", "Calls to the home for slices, and give-backs, that failed.", func(s RegionStats) uint64 { return s.Errors }),
		counter("home_calls_total", "Calls to the home for slices: reservations, checks, give-backs.", func(s RegionStats) uint64 { return s.HomeCalls }),
		counter("takes_total", "Leases this replica took from its region's slices.", func(s RegionStats) uint64 { return s.Takes }),
		counter("misses_total", "Leases this replica asked for while its region held no slice open long enough.", func(s RegionStats) uint64 { return s.Misses }),
		counter("puts_total", "Lease rests put back into their slice.", func(s RegionStats) uint64 { return s.Puts }),
		counter("home_puts_total", "Lease rests given to the home: their slice had closed.", func(s RegionStats) uint64 { return s.HomePuts }),
		counter("short_total", "Slices given back at once: the home's answers left too little of them for a lease.", func(s RegionStats) uint64 { return s.Short }),
	)
}
