package escrow

import (
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
}

// DefaultFlags returns the flags' defaults.
func DefaultFlags() Flags {
	return Flags{Options: Options{Lease: DefaultLease, Threshold: DefaultThreshold, Size: SizeFair,
		Rebalance: DefaultRebalance, MaxKeys: DefaultMaxKeys}}
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
}

// Open returns the Store of f on w, its goroutine running. The caller
// closes it before the stores it wraps.
func (f *Flags) Open(w Wiring) (*Store, error) {
	o := f.Options
	o.Remote, o.Leaser, o.Shares, o.Logger, o.Run = w.Remote, w.Leaser, w.Shares, w.Logger, true
	s, err := New(o)
	if err != nil {
		return nil, err
	}
	s.next = w.SetTree
	if w.Registry != nil {
		w.Registry.MustRegister(NewCollector(s.Stats))
	}
	return s, nil
}
