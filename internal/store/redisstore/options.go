package redisstore

import (
	"fmt"
	"strings"
	"time"

	"github.com/charonlimit/charon/internal/redisfunc"
)

// Clock chooses the clock of the decisions: redisfunc.ClockRedis (the
// default) or redisfunc.ClockCaller. With the caller's clock, one behind
// Redis's forgets keys earlier, never granting less than a fresh state
// would.
type Clock = redisfunc.Clock

// The clocks, as redisfunc names them.
const (
	ClockRedis  = redisfunc.ClockRedis
	ClockCaller = redisfunc.ClockCaller
)

// Defaults of Options.
const (
	DefaultKeyPrefix = "charon:"
	DefaultMaxTTL    = 30 * 24 * time.Hour
	DefaultLockTTL   = 500 * time.Millisecond
)

// Options configure a Store. The zero value is usable.
type Options struct {
	// Cluster tells NewWithClient that a UniversalClient that is not a
	// *redis.ClusterClient talks to a Cluster.
	Cluster bool

	// KeyPrefix starts every key (default DefaultKeyPrefix); it must not
	// hold '{' or '}'.
	KeyPrefix string
	// Clock chooses the decisions' clock; the default is Redis TIME.
	Clock Clock
	// MaxTTL caps every key's time to live (default DefaultMaxTTL): a key
	// expires at its tiers.ForgetAt, or after MaxTTL when that is later or
	// never (a tier above the first with an unbounded active period).
	MaxTTL time.Duration
	// LockTTL paces the locks of a two-step call (Cluster, keys in several
	// slots; default DefaultLockTTL). The locks live ten times LockTTL from
	// the call's prepare, which is how long the locks of a process that
	// dies between the steps block those keys; a call whose prepares took
	// LockTTL or longer checks and extends its locks (a seal) before it
	// commits.
	LockTTL time.Duration
	// Pipelines is the number of dispatcher goroutines that send the
	// concurrent Decide calls' FCALLs together (default DefaultPipelines,
	// DefaultClusterPipelines on a Cluster; negative: none, each call
	// sends its own FCALL on a pooled connection). Each dispatcher has at
	// most one batch in flight and sends, as soon as it returns, the calls
	// queued meanwhile (up to 128).
	Pipelines int
}

func (o Options) withDefaults() (Options, error) {
	if o.KeyPrefix == "" {
		o.KeyPrefix = DefaultKeyPrefix
	}
	if strings.ContainsAny(o.KeyPrefix, "{}") {
		return o, fmt.Errorf("redisstore: key prefix %q holds '{' or '}'", o.KeyPrefix)
	}
	if o.MaxTTL <= 0 {
		o.MaxTTL = DefaultMaxTTL
	}
	if o.LockTTL <= 0 {
		o.LockTTL = DefaultLockTTL
	}
	if o.Clock > ClockCaller {
		return o, fmt.Errorf("redisstore: unknown clock %d", o.Clock)
	}
	return o, nil
}
