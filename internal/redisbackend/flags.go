package redisbackend

import (
	"errors"
	"flag"
	"os"
	"strings"

	"github.com/charonlimit/charon/internal/redisconn"
	"github.com/charonlimit/charon/internal/tlsconfig"
)

// Flags are the Redis settings of `charon serve` as command-line flags.
type Flags struct {
	URL      string
	Cluster  bool
	PoolSize int
	Options  Options // Timeout and FailureMode are bound; the rest is set by the caller
	TLS      tlsconfig.ClientFlags
	Username string
	// Password is never a flag (ps would show it): REDIS_AUTH,
	// CHARON_REDIS_PASSWORD or PasswordFile.
	Password     string
	PasswordFile string
}

// Bind declares --redis-url, --redis-cluster, --redis-pool-size,
// --redis-timeout, --failure-mode and --redis-tls-* on fs, with f's values
// as defaults.
func (f *Flags) Bind(fs *flag.FlagSet) {
	fs.StringVar(&f.URL, "redis-url", f.URL, "Redis `URL` for --store redis: redis://, rediss://, redis-sentinel://, redis-cluster://, unix:// (env CHARON_REDIS_URL)")
	fs.BoolVar(&f.Cluster, "redis-cluster", f.Cluster, "treat the hosts of a redis:// or rediss:// --redis-url as Cluster seeds (env CHARON_REDIS_CLUSTER)")
	fs.IntVar(&f.PoolSize, "redis-pool-size", f.PoolSize, "Redis connections per node; 0: 10 per CPU (env CHARON_REDIS_POOL_SIZE)")
	fs.DurationVar(&f.Options.Timeout, "redis-timeout", f.Options.Timeout, "time limit of a Redis decision when the caller sends no gRPC deadline (with one, Redis is waited for until a quarter of the time left, at least 2ms, before it); then the failure mode decides (env CHARON_REDIS_TIMEOUT)")
	fs.Var(&f.Options.FailureMode, "failure-mode", "what decides while Redis fails: local, open, closed or unavailable (env CHARON_FAILURE_MODE)")
	fs.StringVar(&f.Username, "redis-username", f.Username, "Redis ACL user name (env CHARON_REDIS_USERNAME)")
	fs.StringVar(&f.PasswordFile, "redis-password-file", f.PasswordFile, "read the Redis password from this `file` (a mounted Secret); also CHARON_REDIS_PASSWORD or REDIS_AUTH (env CHARON_REDIS_PASSWORD_FILE)")
	f.TLS.Bind(fs, "redis-tls-", "Redis")
}

// Resolve checks the flags without connecting and returns the Options
// they make (with Local and Logger left to the caller); an error names the
// flag at fault.
func (f *Flags) Resolve() (Options, error) {
	o := f.Options
	o.Conn = redisconn.Options{URL: f.URL, Cluster: f.Cluster, PoolSize: f.PoolSize, Username: f.Username, Password: f.Password}
	switch {
	case f.URL == "":
		return o, errors.New("--store redis needs --redis-url")
	case f.PoolSize < 0:
		return o, errors.New("--redis-pool-size must not be negative")
	case o.Timeout <= 0:
		return o, errors.New("--redis-timeout must be positive")
	case strings.HasPrefix(f.URL, "unix://") && f.Cluster:
		return o, errors.New("--redis-cluster with a unix socket")
	}
	if f.PasswordFile != "" {
		b, err := os.ReadFile(f.PasswordFile)
		if err != nil {
			return o, errors.New("--redis-password-file: " + err.Error())
		}
		if o.Conn.Password = strings.TrimRight(string(b), "\r\n"); o.Conn.Password == "" {
			return o, errors.New("--redis-password-file " + f.PasswordFile + ": empty")
		}
	}
	cfg, err := f.TLS.Config()
	if err != nil {
		return o, errors.New("--redis-tls-*: " + err.Error())
	}
	o.Conn.TLSConfig = cfg
	if err := Check(o); err != nil {
		return o, errors.New("--redis-url: " + err.Error())
	}
	return o, nil
}
