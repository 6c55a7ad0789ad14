package redisconn

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrBadURL is wrapped by the errors of Options.Check, ClientOptions and
// ParseURL for a URL they cannot use; the message never shows the URL's
// password.
var ErrBadURL = errors.New("redisconn: bad Redis URL")

// ErrRefused is wrapped by the error of a dial that Redis refused (nothing
// listens on its port or socket, or the connection was reset as it opened):
// Redis is down, and go-redis does not retry it.
var ErrRefused = errors.New("redisconn: connection refused")

// Options name a Redis deployment and how to connect to it. The zero value
// is not usable: URL or ClusterAddrs is required.
type Options struct {
	// URL names the deployment:
	//   redis://[user:pass@]host:port[/db]          a single node
	//   rediss://...                                the same over TLS
	//   redis-sentinel://[user:pass@]host:port[,host:port...]/master[/db]
	//   rediss-sentinel://...                       Sentinel, TLS to the nodes
	//   redis-cluster://[user:pass@]host:port[,host:port...]
	//   rediss-cluster://...                        Cluster over TLS
	//   unix://[user:pass@]/path/to/socket[?db=N]   a single node's socket
	// user:pass authenticate to the Redis nodes; for Sentinel the query
	// parameters sentinel_username and sentinel_password authenticate to
	// the Sentinels. Query parameters pool_size, dial_timeout, read_timeout
	// and write_timeout (Go durations) are accepted too; a redis://,
	// rediss:// or unix:// URL also takes go-redis' own (max_retries among
	// them). Options fields win over the URL's.
	URL string
	// Cluster treats the hosts of a redis:// or rediss:// URL (or
	// ClusterAddrs) as Cluster seeds; refused with a unix:// URL.
	Cluster bool
	// ClusterAddrs are Cluster seeds, when there is no URL.
	ClusterAddrs []string
	// Username and Password override the URL's.
	Username, Password string
	// TLSConfig overrides the TLS configuration of a rediss URL (and
	// enables TLS for any URL, a unix socket's included).
	TLSConfig *tls.Config
	// PoolSize is the connections per node (0: go-redis' default, 10 per
	// CPU).
	PoolSize int
	// DialTimeout, ReadTimeout and WriteTimeout of the connections (0:
	// go-redis' defaults, 5s, 3s, 3s). Every command also honours its
	// context.
	DialTimeout, ReadTimeout, WriteTimeout time.Duration
	// MaxRetries of a failed command by go-redis: 0 means none (see the
	// package documentation), unless the URL's max_retries asks for some;
	// a positive number retries that many times (a retried script may have
	// run).
	MaxRetries int
}

// Check validates o without connecting.
func (o Options) Check() error {
	_, err := ClientOptions(o)
	return err
}

// Open returns a client of the deployment o names, which the caller closes.
// It does not connect: go-redis dials on first use, so a Redis that is down
// makes the client's commands fail until it is back.
func Open(o Options) (redis.UniversalClient, error) {
	u, err := ClientOptions(o)
	if err != nil {
		return nil, err
	}
	return redis.NewUniversalClient(u), nil
}

// ClientOptions returns the go-redis options of the client Open makes.
func ClientOptions(o Options) (*redis.UniversalOptions, error) {
	var u *redis.UniversalOptions
	switch {
	case o.URL != "":
		var err error
		if u, err = ParseURL(o.URL); err != nil {
			return nil, err
		}
	case len(o.ClusterAddrs) > 0:
		u = &redis.UniversalOptions{Addrs: o.ClusterAddrs, IsClusterMode: true}
	default:
		return nil, fmt.Errorf("%w: no URL and no cluster addresses", ErrBadURL)
	}
	unix := isUnix(o.URL)
	if o.Cluster {
		switch {
		case unix:
			return nil, fmt.Errorf("%w: a Cluster over a unix socket", ErrBadURL)
		case u.MasterName == "":
			u.IsClusterMode = true
		}
	}
	if o.Username != "" {
		u.Username = o.Username
	}
	if o.Password != "" {
		u.Password = o.Password
	}
	if o.TLSConfig != nil {
		u.TLSConfig = o.TLSConfig
	}
	if o.PoolSize > 0 {
		u.PoolSize = o.PoolSize
	}
	if o.DialTimeout > 0 {
		u.DialTimeout = o.DialTimeout
	}
	if o.ReadTimeout > 0 {
		u.ReadTimeout = o.ReadTimeout
	}
	if o.WriteTimeout > 0 {
		u.WriteTimeout = o.WriteTimeout
	}
	switch {
	case o.MaxRetries > 0:
		u.MaxRetries = o.MaxRetries
	case u.MaxRetries <= 0:
		// go-redis reads 0 as its default of 3 and -1 as none.
		u.MaxRetries = -1
	}
	if u.IsClusterMode || (len(u.Addrs) > 1 && u.MasterName == "") {
		// A Cluster client sends a command again when its node cannot be
		// reached (a refused dial included, whatever its error), up to
		// MaxRedirects times, sleeping a backoff before each (8, 16, 32 ms
		// and more at go-redis' defaults: a killed master cost each call
		// about 0.1 s). Without the backoff those attempts are refused at
		// once; a MOVED or ASK is followed at once as before.
		u.MinRetryBackoff, u.MaxRetryBackoff = -1, -1
	}
	// The caller's context bounds every command (the failure-mode layer
	// sets its deadline).
	u.ContextTimeoutEnabled = true
	// One dial per attempt: go-redis' default dials 5 times, 100 ms apart.
	u.DialerRetries = 1
	network, addr := "tcp", ""
	if unix {
		network, addr = "unix", u.Addrs[0]
	}
	u.Dialer = dialer(network, addr, u.DialTimeout, u.TLSConfig)
	return u, nil
}

// dialer returns go-redis' Dialer: TCP to the address go-redis asks for (or
// the unix socket sock), TLS when cfg is set, and a refused dial reported
// as ErrRefused. The error wraps neither net.Error nor the errno, which
// go-redis would retry: it keeps only their text.
func dialer(network, sock string, timeout time.Duration, cfg *tls.Config) func(ctx context.Context, _, addr string) (net.Conn, error) {
	if timeout <= 0 {
		timeout = 5 * time.Second // go-redis' default
	}
	return func(ctx context.Context, _, addr string) (net.Conn, error) {
		if network == "unix" {
			addr = sock
		}
		d := &net.Dialer{Timeout: timeout, KeepAlive: 5 * time.Minute}
		var (
			c   net.Conn
			err error
		)
		if cfg != nil {
			c, err = (&tls.Dialer{NetDialer: d, Config: cfg}).DialContext(ctx, network, addr)
		} else {
			c, err = d.DialContext(ctx, network, addr)
		}
		if err != nil && refused(err) {
			return nil, fmt.Errorf("%w: %s", ErrRefused, err.Error())
		}
		return c, err
	}
}

// refused reports whether a dial's err says that nothing listens there: a
// refused or reset connection, or a unix socket that does not exist.
func refused(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.ENOENT)
}

func isUnix(raw string) bool { return strings.HasPrefix(raw, "unix://") }

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
	case "redis", "rediss", "unix":
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
		return nil, bad("unknown scheme (redis, rediss, redis-sentinel, rediss-sentinel, redis-cluster, rediss-cluster, unix)")
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
