package redisstore

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/charonlimit/charon/internal/redisfunc"
)

// ErrBadURL is wrapped by the errors of New and ParseURL for a URL they
// cannot use.
var ErrBadURL = errors.New("redisstore: bad Redis URL")

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

// Options configure a Store. The zero value (with a URL for New) is usable.
type Options struct {
	// URL names the Redis deployment (New only):
	//   redis://[user:pass@]host:port[/db]          a single node
	//   rediss://...                                the same over TLS
	//   redis-sentinel://[user:pass@]host:port[,host:port...]/master[/db]
	//   rediss-sentinel://...                       Sentinel, TLS to the nodes
	//   redis-cluster://[user:pass@]host:port[,host:port...]
	//   rediss-cluster://...                        Cluster over TLS
	// user:pass authenticate to the Redis nodes; for Sentinel the query
	// parameters sentinel_username and sentinel_password authenticate to
	// the Sentinels. Query parameters pool_size, dial_timeout, read_timeout
	// and write_timeout (Go durations) are accepted too; Options fields win.
	URL string
	// Cluster, with ClusterAddrs, selects Cluster mode without a URL (New),
	// and tells NewWithClient that a UniversalClient that is not a
	// *redis.ClusterClient talks to a Cluster.
	Cluster      bool
	ClusterAddrs []string
	// Username and Password override the URL's.
	Username, Password string
	// TLSConfig overrides the TLS configuration of a rediss URL (and enables
	// TLS for any URL).
	TLSConfig *tls.Config
	// PoolSize is the connections per node (0: go-redis' default, 10 per
	// CPU). Concurrent Decide calls share them, pipelined by the pool.
	PoolSize int
	// DialTimeout, ReadTimeout and WriteTimeout of the connections (0:
	// go-redis' defaults, 5s, 3s, 3s). Decide also honours its context.
	DialTimeout, ReadTimeout, WriteTimeout time.Duration
	// MaxRetries of a failed command by go-redis (0: go-redis' default of 3;
	// -1: none). A retried script may have run.
	MaxRetries int

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

// New connects to the Redis deployment of opts.URL (or opts.ClusterAddrs)
// and returns a Store that owns the client. It does not wait for Redis to
// answer: a Redis that is down makes Decide fail until it is back.
func New(opts Options) (*Store, error) {
	u, err := ClientOptions(opts)
	if err != nil {
		return nil, err
	}
	c := redis.NewUniversalClient(u)
	s, err := newStore(c, true, opts)
	if err != nil {
		c.Close()
		return nil, err
	}
	if u.IsClusterMode {
		s.cluster = true
	}
	return s, nil
}

// ClientOptions returns the go-redis options New uses for opts.
func ClientOptions(opts Options) (*redis.UniversalOptions, error) {
	var u *redis.UniversalOptions
	switch {
	case opts.URL != "":
		var err error
		if u, err = ParseURL(opts.URL); err != nil {
			return nil, err
		}
	case len(opts.ClusterAddrs) > 0:
		u = &redis.UniversalOptions{Addrs: opts.ClusterAddrs, IsClusterMode: true}
	default:
		return nil, fmt.Errorf("%w: no URL and no cluster addresses", ErrBadURL)
	}
	if opts.Cluster && u.MasterName == "" {
		u.IsClusterMode = true
	}
	if opts.Username != "" {
		u.Username = opts.Username
	}
	if opts.Password != "" {
		u.Password = opts.Password
	}
	if opts.TLSConfig != nil {
		u.TLSConfig = opts.TLSConfig
	}
	if opts.PoolSize > 0 {
		u.PoolSize = opts.PoolSize
	}
	if opts.DialTimeout > 0 {
		u.DialTimeout = opts.DialTimeout
	}
	if opts.ReadTimeout > 0 {
		u.ReadTimeout = opts.ReadTimeout
	}
	if opts.WriteTimeout > 0 {
		u.WriteTimeout = opts.WriteTimeout
	}
	if opts.MaxRetries != 0 {
		u.MaxRetries = opts.MaxRetries
	}
	// Decide's context bounds every call (the failure-mode layer sets it).
	u.ContextTimeoutEnabled = true
	// A refused dial is evidence that Redis is down: report it at once
	// (go-redis' default retries a failed dial 5 times, 100 ms apart, so a
	// caller allowing seconds would wait them out before the breaker heard
	// of the outage).
	u.DialerRetries = 1
	return u, nil
}

// ParseURL parses the URL forms of Options.URL.
func ParseURL(raw string) (*redis.UniversalOptions, error) {
	bad := func(why string) error {
		return fmt.Errorf("%w: %s", ErrBadURL, RedactURL(fmt.Sprintf("%q: %s", raw, why), raw))
	}
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return nil, bad("no scheme")
	}
	switch scheme {
	case "redis", "rediss":
		o, err := redis.ParseURL(raw)
		if err != nil {
			return nil, bad(err.Error())
		}
		// Every option go-redis takes from the URL's query (it refuses
		// those it does not know), none dropped.
		return &redis.UniversalOptions{
			Addrs: []string{o.Addr}, Username: o.Username, Password: o.Password, DB: o.DB,
			TLSConfig: o.TLSConfig, PoolSize: o.PoolSize, DialTimeout: o.DialTimeout,
			ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout, MaxRetries: o.MaxRetries,
			ClientName: o.ClientName, Protocol: o.Protocol,
			MinRetryBackoff: o.MinRetryBackoff, MaxRetryBackoff: o.MaxRetryBackoff,
			PoolFIFO: o.PoolFIFO, PoolTimeout: o.PoolTimeout, MinIdleConns: o.MinIdleConns,
			MaxIdleConns: o.MaxIdleConns, MaxActiveConns: o.MaxActiveConns,
			ConnMaxIdleTime: o.ConnMaxIdleTime, ConnMaxLifetime: o.ConnMaxLifetime,
		}, nil
	case "redis-sentinel", "rediss-sentinel", "redis-cluster", "rediss-cluster":
	default:
		return nil, bad("unknown scheme (redis, rediss, redis-sentinel, rediss-sentinel, redis-cluster, rediss-cluster)")
	}
	u := &redis.UniversalOptions{}
	rest, query, _ := strings.Cut(rest, "?")
	hosts, path, _ := strings.Cut(rest, "/")
	if at := strings.LastIndexByte(hosts, '@'); at >= 0 {
		user, pass, hasPass := strings.Cut(hosts[:at], ":")
		var err error
		if u.Username, err = url.PathUnescape(user); err != nil {
			return nil, bad("user: " + err.Error())
		}
		if hasPass {
			if u.Password, err = url.PathUnescape(pass); err != nil {
				return nil, bad("password: " + err.Error())
			}
		}
		hosts = hosts[at+1:]
	}
	for _, h := range strings.Split(hosts, ",") {
		if h == "" {
			continue
		}
		if _, _, ok := strings.Cut(h, ":"); !ok {
			h += ":6379"
		}
		u.Addrs = append(u.Addrs, h)
	}
	if len(u.Addrs) == 0 {
		return nil, bad("no host")
	}
	if strings.HasPrefix(scheme, "rediss") {
		u.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	parts := strings.Split(strings.Trim(path, "/"), "/")
	if strings.HasSuffix(scheme, "-sentinel") {
		if parts[0] == "" {
			return nil, bad("no master name (redis-sentinel://host:port/mastername)")
		}
		u.MasterName = parts[0]
		if len(parts) > 1 {
			db, err := strconv.Atoi(parts[1])
			if err != nil || db < 0 {
				return nil, bad("bad DB index")
			}
			u.DB = db
		}
		if len(parts) > 2 {
			return nil, bad("path after the DB index")
		}
	} else {
		u.IsClusterMode = true
		if parts[0] != "" {
			return nil, bad("a Cluster has no DB index or path")
		}
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return nil, bad(err.Error())
	}
	for k, vs := range q {
		v := vs[len(vs)-1]
		var err error
		switch k {
		case "sentinel_username":
			u.SentinelUsername = v
		case "sentinel_password":
			u.SentinelPassword = v
		case "pool_size":
			u.PoolSize, err = strconv.Atoi(v)
		case "dial_timeout":
			u.DialTimeout, err = time.ParseDuration(v)
		case "read_timeout":
			u.ReadTimeout, err = time.ParseDuration(v)
		case "write_timeout":
			u.WriteTimeout, err = time.ParseDuration(v)
		default:
			return nil, bad("unknown parameter " + k)
		}
		if err != nil {
			return nil, bad(k + ": " + err.Error())
		}
	}
	return u, nil
}

// RedactURL hides the secrets of the Redis URL raw (its password, with or
// without a scheme, and a sentinel_password parameter) in msg, escaped or
// not: messages of URL parsers quote the URL they fail on.
func RedactURL(msg, raw string) string {
	var secrets []string
	rest := raw
	if _, r, ok := strings.Cut(raw, "://"); ok {
		rest = r
	}
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		if _, pass, ok := strings.Cut(rest[:at], ":"); ok {
			secrets = append(secrets, pass)
		}
	}
	if _, query, ok := strings.Cut(rest, "?"); ok {
		for _, kv := range strings.Split(query, "&") {
			if v, ok := strings.CutPrefix(kv, "sentinel_password="); ok {
				secrets = append(secrets, v)
			}
		}
	}
	for _, sec := range secrets {
		for _, form := range []string{sec, unescape(sec), url.QueryEscape(sec)} {
			if form == "" {
				continue
			}
			// As %q writes it too (a " or \ escaped), first.
			q := strconv.Quote(form)
			msg = strings.ReplaceAll(msg, q[1:len(q)-1], "xxxxx")
			msg = strings.ReplaceAll(msg, form, "xxxxx")
		}
	}
	return msg
}

func unescape(s string) string {
	if u, err := url.QueryUnescape(s); err == nil {
		return u
	}
	return s
}
