package escrowsim

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/charonlimit/charon/internal/escrow"
	"github.com/charonlimit/charon/internal/sharestore"
	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/tiers"
)

// Options configure a run (DefaultOptions: the verb's defaults). Limit,
// Window, Replicas, Regions, Duration and Rate are required; the zero
// value of every other field is its default.
type Options struct {
	// The rule: a sliding window of Limit hits per Window.
	Limit  int64
	Window time.Duration
	// Replicas in Regions (replica i is in region i mod Regions).
	Replicas, Regions int
	// Duration is the length of the run.
	Duration time.Duration
	// Latency is the round trip between each region and the home.
	Latency time.Duration
	// Lease, Threshold and Rebalance are each replica's escrow.Options'
	// (0: escrow's defaults).
	Lease     time.Duration
	Threshold float64
	Rebalance time.Duration
	// Rate is the load offered, a multiple of the limit (10: ten times
	// Limit per Window, over every replica).
	Rate float64
	// Skew is the heavy replica's rate, a multiple of each other one's
	// (0 or 1: the same rate everywhere). Replica 0 is heavy first; from
	// Shift on (0: never), replica 1 is.
	Skew  float64
	Shift time.Duration
	// Kill, when positive, kills the replica that is heavy then: it gets
	// no more requests (the others share its rate), and every call it
	// makes fails.
	Kill time.Duration
	// Cut, when positive, cuts CutRegion off from the home for CutFor.
	Cut, CutFor time.Duration
	CutRegion   int
	// Seed seeds the random (Poisson) arrivals.
	Seed uint64
	// Pools gives each region a pool (escrow.NewMemPool) and each replica
	// an escrow.Region that leases slices of at most RegionLease (0:
	// escrow.DefaultRegionLease) from the home into it, from which the
	// replica takes its leases: a lease never leaves the region. Without
	// it every replica leases from the home itself, through its region's
	// link (a single region's mode).
	Pools       bool
	RegionLease time.Duration
}

// DefaultRegionLatency is the round trip to the home of Bind's flags when
// there is more than one region and --latency is not given.
const DefaultRegionLatency = 80 * time.Millisecond

// DefaultOptions returns the flags' defaults: 3 replicas in one region, a
// limit of 1000 per second offered at 10 times for 60 s, replica 0 at 10
// times each other's rate, replica 1 from 20 s, the last region cut off
// from 30 s to 35 s, the heavy replica killed at 45 s.
func DefaultOptions() Options {
	return Options{Limit: 1000, Window: time.Second, Replicas: 3, Regions: 1, Duration: time.Minute,
		Lease: escrow.DefaultLease, Threshold: escrow.DefaultThreshold, Rebalance: escrow.DefaultRebalance, RegionLease: escrow.DefaultRegionLease,
		Rate: 10, Skew: 10, Shift: 20 * time.Second, Kill: 45 * time.Second, Cut: 30 * time.Second, CutFor: 5 * time.Second,
		CutRegion: -1, Seed: 1}
}

// Bind declares the flags of `charon escrow-sim` on fs, one per field,
// with o's values as defaults; Parsed settles what depends on
// other flags once fs is parsed.
func (o *Options) Bind(fs *flag.FlagSet) {
	fs.Int64Var(&o.Limit, "limit", o.Limit, "the rule's limit: hits per --window (a sliding window)")
	fs.DurationVar(&o.Window, "window", o.Window, "the rule's window")
	fs.IntVar(&o.Replicas, "replicas", o.Replicas, "replicas, each an escrow store deciding on its own")
	fs.IntVar(&o.Regions, "regions", o.Regions, "regions (replica i is in region i mod --regions), each reaching the home through a link of its own")
	fs.DurationVar(&o.Duration, "duration", o.Duration, "length of the run")
	fs.DurationVar(&o.Latency, "latency", o.Latency, "round trip between each region and the home, added to every call (default 80ms with --regions > 1, else 0)")
	fs.DurationVar(&o.Lease, "lease", o.Lease, "the longest lease (serve's --escrow-lease): leases last a twentieth of --window, at most this")
	fs.Float64Var(&o.Threshold, "threshold", o.Threshold, "decisions per second on a replica from which the key is decided from leases (serve's --escrow-threshold)")
	fs.DurationVar(&o.Rebalance, "rebalance", o.Rebalance, "how often the fair shares are computed again (serve's --escrow-rebalance)")
	fs.Float64Var(&o.Rate, "rate", o.Rate, "the load offered over every replica, a multiple of the limit (0.9: 90% of --limit per --window)")
	fs.Float64Var(&o.Skew, "skew", o.Skew, "the heavy replica's rate, a multiple of each other one's (1: even)")
	fs.DurationVar(&o.Shift, "shift", o.Shift, "from then on replica 1 is the heavy one, not replica 0 (0: never)")
	fs.DurationVar(&o.Kill, "kill", o.Kill, "kill the heavy replica then: its requests go to the others, its calls fail, its leases stay counted until they expire (0: never)")
	fs.DurationVar(&o.Cut, "cut", o.Cut, "cut --cut-region off from the home then, for --cut-for (0: never)")
	fs.DurationVar(&o.CutFor, "cut-for", o.CutFor, "how long the region stays cut off")
	fs.IntVar(&o.CutRegion, "cut-region", o.CutRegion, "the region cut off (-1: the last)")
	fs.Uint64Var(&o.Seed, "seed", o.Seed, "seed of the random (Poisson) arrivals")
	fs.BoolVar(&o.Pools, "pools", o.Pools, "each region keeps slices of the home's budget in a pool its replicas lease from, as serve's --escrow-home does (default with --regions > 1; false: every replica leases from the home)")
	fs.DurationVar(&o.RegionLease, "region-lease", o.RegionLease, "the longest slice a region leases from the home, with --pools (serve's --escrow-region-lease)")
}

// Parsed settles, once fs (on which Bind declared o's flags) is parsed,
// the defaults that depend on other flags: with more than one region, a
// round trip of DefaultRegionLatency and pools when --latency and --pools
// are not given; the last region as --cut-region -1.
func (o *Options) Parsed(fs *flag.FlagSet) {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if o.Regions > 1 && !given["latency"] {
		o.Latency = DefaultRegionLatency
	}
	if o.Regions > 1 && !given["pools"] {
		o.Pools = true
	}
	if o.CutRegion == -1 {
		o.CutRegion = o.Regions - 1
	}
}

// Check refuses options that cannot run, naming the flag (Bind's) of each
// field it refuses.
func (o *Options) Check() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if o.Limit < 1 {
		bad("--limit %d: want at least 1", o.Limit)
	}
	if o.Window < tiers.LeaseRatio*tiers.MinLease {
		bad("--window %v: want at least %v (%d of the shortest lease, %v)", o.Window, tiers.LeaseRatio*tiers.MinLease, tiers.LeaseRatio, tiers.MinLease)
	}
	if o.Replicas < 1 {
		bad("--replicas %d: want at least 1", o.Replicas)
	}
	if o.Regions < 1 || o.Regions > max(o.Replicas, 1) {
		bad("--regions %d: want 1 to --replicas (%d)", o.Regions, o.Replicas)
	}
	if o.Duration < o.Window {
		bad("--duration %v: want at least one --window (%v)", o.Duration, o.Window)
	}
	if o.Latency < 0 {
		bad("--latency %v: want 0 or more", o.Latency)
	}
	if o.Lease < 0 {
		bad("--lease %v: want 0 (escrow's default) or more", o.Lease)
	}
	if o.Threshold < 0 || math.IsNaN(o.Threshold) {
		bad("--threshold %v: want 0 (escrow's default) or more", o.Threshold)
	}
	if o.Rebalance < 0 {
		bad("--rebalance %v: want 0 (escrow's default) or more", o.Rebalance)
	}
	if o.RegionLease < 0 {
		bad("--region-lease %v: want 0 (escrow's default) or more", o.RegionLease)
	}
	if !(o.Rate > 0) || math.IsInf(o.Rate, 0) {
		bad("--rate %v: want a positive multiple of the limit", o.Rate)
	}
	if o.Skew < 0 || math.IsNaN(o.Skew) {
		bad("--skew %v: want 0 or more", o.Skew)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"shift", o.Shift}, {"kill", o.Kill}, {"cut", o.Cut}, {"cut-for", o.CutFor}} {
		if d.v < 0 {
			bad("--%s %v: want 0 (never) or more", d.name, d.v)
		}
	}
	if o.Kill > 0 && o.Replicas < 2 {
		bad("--kill %v: want at least 2 --replicas (one is left to answer)", o.Kill)
	}
	if o.Cut > 0 && (o.CutRegion < 0 || o.CutRegion >= o.Regions) {
		bad("--cut-region %d: want 0 to %d", o.CutRegion, o.Regions-1)
	}
	return errors.Join(errs...)
}

// outcome is what became of a request.
type outcome uint8

const (
	granted outcome = iota
	rejected
	failed
)

// record is one request: which replica took it, when it was sent and
// when it was decided (ns from the start: the home's instant for a
// decision on the shared path, else the instant it was sent), how long
// its decision took, and its outcome.
type record struct {
	replica  int32
	outcome  outcome
	shared   bool // decided on the home
	sent, at int64
	took     int64
}

// sample is what each window boundary reads: per replica its fair share
// and the hits it holds; the calls so far.
type sample struct {
	shares, held      []int64
	home, region      uint64
	killed            []bool
	localG, localR, n uint64
}

// replica is one escrow.Store, its Region with pools, whether it is
// killed, and the record of its requests.
type replica struct {
	store       *escrow.Store
	region      *escrow.Region
	regionIndex int
	dead        atomic.Bool
	mu          sync.Mutex
	rec         []record
}

// Run runs a simulation with o and returns what it measured.
func Run(ctx context.Context, o Options) (*Result, error) {
	if err := o.Check(); err != nil {
		return nil, err
	}
	pol := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: o.Limit, Window: o.Window, Active: tiers.Unbounded}}}
	if err := tiers.Validate(pol); err != nil {
		return nil, err
	}
	key := store.Key{Resource: "escrow-sim", Domain: "sim", PolicyID: 1}

	mem := memstore.New(memstore.Options{MaxKeys: -1})
	defer mem.Close()
	home := &homeStore{store: mem}
	var homeCalls, regionCalls atomic.Uint64
	links := make([]*link, o.Regions)
	pools := make([]escrow.Pool, o.Regions)
	shares := make([]*sharestore.Memory, o.Regions)
	for r := range links {
		links[r] = &link{home: home, oneWay: o.Latency / 2, calls: &homeCalls}
		pools[r] = escrow.NewMemPool(nil)
		shares[r] = &sharestore.Memory{}
	}
	reps := make([]*replica, o.Replicas)
	// The replicas' stores close first (they give their leases back into
	// their regions' slices), then the Regions (they give the slices' rest
	// back to the home).
	closeAll := sync.OnceFunc(func() {
		for _, rp := range reps {
			if rp != nil {
				rp.store.Close()
			}
		}
		for _, rp := range reps {
			if rp != nil && rp.region != nil {
				rp.region.Close()
			}
		}
	})
	defer closeAll()
	for i := range reps {
		rp := &replica{regionIndex: i % o.Regions}
		id := fmt.Sprintf("replica-%d", i)
		toHome := killable{l: links[rp.regionIndex], dead: &rp.dead}
		var leaser escrow.Leaser = toHome
		if o.Pools {
			r, err := escrow.NewRegion(escrow.RegionOptions{Home: toHome, Pool: killablePool{p: pools[rp.regionIndex], dead: &rp.dead},
				Name: fmt.Sprintf("region-%d", rp.regionIndex), ID: id, Lease: o.RegionLease, Run: true})
			if err != nil {
				return nil, err
			}
			rp.region, leaser = r, r
		}
		s, err := escrow.New(escrow.Options{
			Remote: toHome, Leaser: killable{l: leaser, dead: &rp.dead, calls: &regionCalls},
			Shares: killableShares{s: shares[rp.regionIndex], dead: &rp.dead}, Size: escrow.SizeFair,
			ID: id, Default: true, Lease: o.Lease, Threshold: o.Threshold, Rebalance: o.Rebalance, Run: true,
			Regional: o.Pools,
		})
		if err != nil {
			if rp.region != nil {
				rp.region.Close()
			}
			return nil, err
		}
		rp.store = s
		reps[i] = rp
	}

	rng := rand.New(rand.NewPCG(o.Seed, 0x65736372))
	total := o.Rate * float64(o.Limit) / o.Window.Seconds() // requests per second
	skew := max(o.Skew, 1)
	heavy, killed := 0, -1
	start := time.Now()
	var wg sync.WaitGroup
	var samples []sample
	it := store.Item{Key: key, Policy: pol, Hits: 1, Min: 1}
	read := func(now time.Time) sample {
		sm := sample{shares: make([]int64, len(reps)), held: make([]int64, len(reps)), killed: make([]bool, len(reps)),
			home: homeCalls.Load(), region: regionCalls.Load()}
		for i, rp := range reps {
			sm.shares[i], sm.killed[i] = -1, rp.dead.Load()
			if h, ok := rp.store.Holding(&it, now); ok {
				sm.shares[i], sm.held[i] = h.Share, h.Held
			}
			st := rp.store.Stats()
			sm.localG += st.LocalGranted
			sm.localR += st.LocalRejected
		}
		return sm
	}
	samples = append(samples, read(start))
	send := func(i int, rp *replica) {
		defer wg.Done()
		var stamp time.Time
		cctx, cancel := context.WithTimeout(withStamp(ctx, &stamp), max(10*o.Latency, 5*time.Second))
		defer cancel()
		items := []store.Item{it}
		out := make([]tiers.Decision, 1)
		t0 := time.Now()
		err := rp.store.Decide(cctx, t0, items, out)
		took := time.Since(t0)
		r := record{replica: int32(i), sent: int64(t0.Sub(start)), at: int64(t0.Sub(start)), took: int64(took)}
		if !stamp.IsZero() {
			r.shared, r.at = true, int64(stamp.Sub(start))
		}
		switch {
		case err != nil:
			r.outcome = failed
		case out[0].OK:
			r.outcome = granted
		default:
			r.outcome = rejected
		}
		rp.mu.Lock()
		rp.rec = append(rp.rec, r)
		rp.mu.Unlock()
	}

	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	last, nextRow := start, start.Add(o.Window)
	shifted, cutOn, cutOff := false, false, false
	rates := make([]float64, len(reps))
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-tick.C:
		}
		now := time.Now()
		el := now.Sub(start)
		if o.Shift > 0 && !shifted && el >= o.Shift {
			shifted = true
			heavy = nextLive(reps, heavy)
		}
		if o.Kill > 0 && killed < 0 && el >= o.Kill {
			killed = heavy
			reps[killed].dead.Store(true)
			heavy = nextLive(reps, heavy)
		}
		if o.Cut > 0 && !cutOn && el >= o.Cut {
			cutOn = true
			links[o.CutRegion].cut.Store(true)
		}
		if cutOn && !cutOff && el >= o.Cut+o.CutFor {
			cutOff = true
			links[o.CutRegion].cut.Store(false)
		}
		for !now.Before(nextRow) {
			samples = append(samples, read(nextRow))
			nextRow = nextRow.Add(o.Window)
		}
		if el >= o.Duration {
			break
		}
		// The rates: the heavy replica skew times each other live one's.
		// Before the kill, the heavy one is the replica heavy then;
		// after, its rate is shared by the others evenly.
		var w float64
		for i, rp := range reps {
			rates[i] = 0
			if rp.dead.Load() {
				continue
			}
			rates[i] = 1
			if i == heavy && killed < 0 {
				rates[i] = skew
			}
			w += rates[i]
		}
		dt := now.Sub(last).Seconds()
		last = now
		for i, rp := range reps {
			for n := poisson(rng, total*rates[i]/w*dt); n > 0; n-- {
				wg.Add(1)
				go send(i, rp)
			}
		}
	}
	tick.Stop()
	wg.Wait()
	samples = append(samples, read(time.Now()))
	// What the live replicas and Regions hold is given back now (a killed
	// one's calls fail: its leases stay counted).
	closeAll()
	var recs []record
	for _, rp := range reps {
		recs = append(recs, rp.rec...)
	}
	res := measure(o, recs, samples)
	for _, rp := range reps {
		st := rp.store.Stats()
		res.Summary.Leases += st.Leases
		res.Summary.GivenBack += st.GivenBack
		res.Summary.Expired += st.Expired
		res.Summary.Refused += st.Refused
		if rp.region != nil {
			rs := rp.region.Stats()
			res.Summary.Slices += rs.Slices
			res.Summary.SliceHits += rs.SliceHits
			res.Summary.SlicesRefused += rs.Refused
			res.Summary.SliceCalls += rs.HomeCalls
			res.Summary.Misses += rs.Misses
			res.Summary.Short += rs.Short
		}
	}
	return res, nil
}

// nextLive returns the replica after i that is not killed (i itself when
// it is the only one).
func nextLive(reps []*replica, i int) int {
	for k := 1; k <= len(reps); k++ {
		if j := (i + k) % len(reps); !reps[j].dead.Load() {
			return j
		}
	}
	return i
}

// poisson draws a count of arrivals of mean m.
func poisson(rng *rand.Rand, m float64) int {
	if m <= 0 {
		return 0
	}
	if m > 30 {
		// The normal approximation, for the rates of a tick far longer
		// than a millisecond (a busy machine).
		return max(0, int(math.Round(m+math.Sqrt(m)*rng.NormFloat64())))
	}
	l, k, p := math.Exp(-m), 0, 1.0
	for {
		p *= rng.Float64()
		if p <= l {
			return k
		}
		k++
	}
}
