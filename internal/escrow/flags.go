package escrow

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/sharestore"
	"github.com/charonlimit/charon/internal/store"
)

// Flags are the escrow settings of `charon serve`: the fields of Options
// that are flags.
type Flags struct {
	Options Options // Default, Lease, Threshold, Size, Rebalance, MaxKeys
	// Home is the URL of the home store (--escrow-home): with it, this
	// replica's --redis-url is its region's Redis, which keeps the
	// region's slices of the home's budgets; Region names the region
	// (--escrow-region) and RegionLease is the longest slice
	// (--escrow-region-lease).
	Home, Region string
	RegionLease  time.Duration
}

// DefaultFlags returns the flags' defaults.
func DefaultFlags() Flags {
	return Flags{Options: Options{Lease: DefaultLease, Threshold: DefaultThreshold, Size: SizeFair,
		Rebalance: DefaultRebalance, MaxKeys: DefaultMaxKeys}, RegionLease: DefaultRegionLease}
}

// Bind declares --escrow, --escrow-lease, --escrow-threshold,
// --escrow-size, --escrow-rebalance and --escrow-max-keys on fs.
func (f *Flags) Bind(fs *flag.FlagSet) {
	o := &f.Options
	fs.BoolVar(&o.Default, "escrow", o.Default, "with --store redis, decide hot keys of every rule whose descriptor does not say escrow: false from escrow leases: slices of the limit Redis has counted, granted without a round trip (a descriptor's escrow: true asks for it without this flag)")
	fs.DurationVar(&o.Lease, "escrow-lease", o.Lease, "the longest escrow lease: a rule's leases last a twentieth of its shortest window (1s with a hard or global limit), at most this; a rule whose window is under 20ms stays on Redis, with a warning at load")
	fs.Float64Var(&o.Threshold, "escrow-threshold", o.Threshold, "decisions per second of one key on this replica from which it is decided from leases; it leaves escrow under half of it")
	fs.Var(&o.Size, "escrow-size", "lease sizing: fair (each replica's leases hold at most its max-min fair share of the limit by reported demand, through Redis) or demand (this replica's demand alone, up to the limit)")
	fs.DurationVar(&o.Rebalance, "escrow-rebalance", o.Rebalance, "how often the fair shares of keys in escrow are computed again")
	fs.IntVar(&o.MaxKeys, "escrow-max-keys", o.MaxKeys, "most keys in escrow at once on this replica")
	fs.StringVar(&f.Home, "escrow-home", f.Home, "the home Redis of a region's replicas (a URL as --redis-url takes, with its credentials and TLS options): it holds every budget and decides cold keys; --redis-url is then the region's Redis, which keeps the slices of hot keys' budgets the region leases from the home (empty: one region, today's mode)")
	fs.StringVar(&f.Region, "escrow-region", f.Region, "this replica's region, with --escrow-home (logs and the replica's name in its region's refill lock)")
	fs.DurationVar(&f.RegionLease, "escrow-region-lease", f.RegionLease, "the longest slice a region leases from the home: a key's slices are as short as they can serve (twice the home's last answer plus one lease of a replica, at most 100ms with --escrow-home), and at least a fortieth of its shortest window, at most this")
}

// Check refuses values that cannot work, naming the flag.
func (f *Flags) Check() error {
	o := &f.Options
	switch {
	case o.Lease < time.Millisecond:
		return fmt.Errorf("--escrow-lease %v: want at least 1ms", o.Lease)
	case o.Lease > time.Minute:
		return fmt.Errorf("--escrow-lease %v: want at most 1m (a crashed replica's lease stays counted until its window forgets it)", o.Lease)
	case o.Threshold <= 0:
		return fmt.Errorf("--escrow-threshold %v: want a positive rate", o.Threshold)
	case o.Rebalance < 10*time.Millisecond:
		return fmt.Errorf("--escrow-rebalance %v: want at least 10ms", o.Rebalance)
	case o.MaxKeys < 1:
		return fmt.Errorf("--escrow-max-keys %d: want at least 1", o.MaxKeys)
	case f.Region != "" && f.Home == "":
		return fmt.Errorf("--escrow-region %q: needs --escrow-home (the store the region leases from)", f.Region)
	case f.RegionLease < 10*time.Millisecond || f.RegionLease > time.Minute:
		return fmt.Errorf("--escrow-region-lease %v: want 10ms to 1m", f.RegionLease)
	}
	return nil
}

// Wiring is what a process hands escrow: the shared path, the store leases
// are taken from, the share store, and where to report.
type Wiring struct {
	// Remote is the shared path (the Redis store behind its failure
	// mode), Leaser the Redis store itself, Shares the share store of fair
	// shares (nil: demand sizing).
	Remote store.Store
	Leaser Leaser
	Shares sharestore.Store
	// SetTree, when set, is called by the Store's SetTree before its own
	// (the backend's: it flushes the over-limit cache).
	SetTree func(*descriptors.Tree)
	Logger  *slog.Logger
	// Registry, when set, gets the Store's collector.
	Registry prometheus.Registerer
	// Pool, with Flags.Home, keeps the region's slices (the region's
	// Redis); Leaser is then the home store, which the Region leases
	// from.
	Pool Pool
}

// Open returns the Store of f on w, its goroutine running. The caller
// closes it before the stores it wraps.
func (f *Flags) Open(w Wiring) (*Store, error) {
	o := f.Options
	o.Remote, o.Leaser, o.Shares, o.Logger, o.Run = w.Remote, w.Leaser, w.Shares, w.Logger, true
	var region *Region
	if f.Home != "" {
		if w.Pool == nil || w.Leaser == nil {
			return nil, errors.New("escrow: a region needs its pool and the home store")
		}
		r, err := NewRegion(RegionOptions{Home: w.Leaser, Pool: w.Pool, Name: f.Region, Lease: f.RegionLease,
			Logger: w.Logger, Run: true})
		if err != nil {
			return nil, err
		}
		region, o.Leaser = r, r
	}
	s, err := New(o)
	if err != nil {
		if region != nil {
			region.Close()
		}
		return nil, err
	}
	s.next, s.region = w.SetTree, region
	if w.Registry != nil {
		w.Registry.MustRegister(NewCollector(s.Stats))
		if region != nil {
			w.Registry.MustRegister(NewRegionCollector(region.Stats))
		}
	}
	return s, nil
}
