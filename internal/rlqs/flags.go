package rlqs

import (
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/sharestore"
)

// Flags are the flags of charon serve that configure the RLQS service.
type Flags struct {
	On           bool
	Interval     time.Duration
	TTL          time.Duration
	Tolerance    float64
	Unmatched    string
	UnmatchedTTL time.Duration
	IdleAfter    time.Duration
	// RestartHold assigns nothing for a TTL after start when the store
	// does not outlive the process (Options.Hold).
	RestartHold bool
}

// DefaultFlags are the defaults: served, a 1 s interval, 3 s TTLs.
func DefaultFlags() Flags {
	return Flags{On: true, Interval: DefaultInterval, TTL: DefaultTTL, Tolerance: DefaultTolerance, Unmatched: "allow",
		UnmatchedTTL: DefaultUnmatchedTTL, IdleAfter: DefaultIdleAfter, RestartHold: true}
}

// Bind declares the flags on fs.
func (f *Flags) Bind(fs *flag.FlagSet) {
	fs.BoolVar(&f.On, "rlqs", f.On, "serve Envoy's Rate Limit Quota Service (rate_limit_quota filter) on the gRPC port")
	fs.DurationVar(&f.Interval, "rlqs-interval", f.Interval, "how often assignments are renewed and budgets whose demands moved split again (Envoy reports every 5s whatever its reporting_interval says; nothing needs to match)")
	fs.DurationVar(&f.TTL, "rlqs-ttl", f.TTL, "time to live of quota assignments (whole seconds, at least 1 s and an interval; about three intervals)")
	fs.Float64Var(&f.Tolerance, "rlqs-tolerance", f.Tolerance, "relative change of a share worth a new assignment (each starts a full token bucket in Envoy)")
	fs.StringVar(&f.Unmatched, "rlqs-unmatched", f.Unmatched, "answer to a bucket no rule limits: allow or deny (a blanket rule)")
	fs.DurationVar(&f.UnmatchedTTL, "rlqs-unmatched-ttl", f.UnmatchedTTL, "time to live of the --rlqs-unmatched answer")
	fs.BoolVar(&f.RestartHold, "rlqs-restart-hold", f.RestartHold, "with --store memory, assign nothing for --rlqs-ttl after start, while Envoys run out the assignments of a previous process")
	fs.DurationVar(&f.IdleAfter, "rlqs-idle", f.IdleAfter, "abandon a bucket that reports no requests for this long (abandon_action), reclaiming its share")
}

// Check refuses values that cannot work, naming the flag.
func (f *Flags) Check() error {
	switch {
	case f.Interval < 100*time.Millisecond:
		return fmt.Errorf("--rlqs-interval %v: want at least 100ms", f.Interval)
	case f.TTL < time.Second || f.TTL%time.Second != 0 || f.TTL <= f.Interval:
		return fmt.Errorf("--rlqs-ttl %v: want whole seconds (Envoy reads whole seconds), longer than --rlqs-interval", f.TTL)
	case f.Tolerance < 0 || f.Tolerance >= 1:
		return fmt.Errorf("--rlqs-tolerance %v: want 0 to 1", f.Tolerance)
	case f.Unmatched != "allow" && f.Unmatched != "deny":
		return fmt.Errorf("--rlqs-unmatched %q: want allow or deny", f.Unmatched)
	case f.UnmatchedTTL < time.Second || f.UnmatchedTTL%time.Second != 0:
		return fmt.Errorf("--rlqs-unmatched-ttl %v: want whole seconds", f.UnmatchedTTL)
	case f.IdleAfter <= f.TTL:
		return fmt.Errorf("--rlqs-idle %v: want longer than --rlqs-ttl", f.IdleAfter)
	}
	return nil
}

// Options are the Allocator's options of f.
func (f *Flags) Options(store sharestore.Store, tree func() *descriptors.Tree, log *slog.Logger) Options {
	o := Options{Store: store, Tree: tree, Interval: f.Interval, TTL: f.TTL, Tolerance: f.Tolerance,
		UnmatchedTTL: f.UnmatchedTTL, IdleAfter: f.IdleAfter, Logger: log}
	if f.Unmatched == "deny" {
		o.Unmatched = DenyAll
	}
	return o
}
