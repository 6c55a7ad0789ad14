package main

import (
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"

	"github.com/charonlimit/charon/internal/redisbackend"
	"github.com/charonlimit/charon/internal/store/memstore"
)

// redisFlags declares the Redis store's flags (besides --store and
// --redis-url).
func redisFlags(fs *flag.FlagSet, c *serveConfig) {
	fs.BoolVar(&c.RedisCluster, "redis-cluster", c.RedisCluster, "treat the hosts of a redis:// or rediss:// --redis-url as Cluster seeds (env CHARON_REDIS_CLUSTER)")
	fs.IntVar(&c.RedisPoolSize, "redis-pool-size", c.RedisPoolSize, "Redis connections per node; 0: 10 per CPU (env CHARON_REDIS_POOL_SIZE)")
	fs.DurationVar(&c.RedisTimeout, "redis-timeout", c.RedisTimeout, "time limit of a Redis decision when the caller sends no gRPC deadline (with one, Redis is waited for until 2ms before it); then the failure mode decides (env CHARON_REDIS_TIMEOUT)")
	fs.Var(&c.FailureMode, "failure-mode", "what decides while Redis fails: local, open, closed or unavailable (env CHARON_FAILURE_MODE)")
}

// applyLyftRedisEnv maps envoyproxy/ratelimit's Redis variables:
//
//	BACKEND_TYPE=redis       --store redis (other values are refused)
//	REDIS_URL                --store redis and --redis-url, by REDIS_TYPE:
//	  SINGLE (default)         host:port -> redis://host:port (a path with REDIS_SOCKET_TYPE=unix -> unix://path)
//	  SENTINEL                 master,host:port,... -> redis-sentinel://host:port,.../master
//	  CLUSTER                  host:port,... -> redis-cluster://host:port,...
//	REDIS_TLS=true           rediss schemes
//	REDIS_AUTH               password, or user:password
//	REDIS_POOL_SIZE          --redis-pool-size
//
// Their other Redis variables (per-second Redis, pipelining, TLS files) are
// not mapped.
func applyLyftRedisEnv(c *serveConfig, getenv func(string) string) error {
	switch v := getenv("BACKEND_TYPE"); strings.ToLower(v) {
	case "":
	case "redis":
		c.Store = "redis"
	default:
		return fmt.Errorf("%w: BACKEND_TYPE=%q: only redis is supported (or leave it unset for the in-memory store)", errUsage, v)
	}
	if v := getenv("REDIS_POOL_SIZE"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return fmt.Errorf("%w: REDIS_POOL_SIZE=%q: not a connection count", errUsage, v)
		}
		c.RedisPoolSize = n
	}
	if v := getenv("REDIS_AUTH"); v != "" {
		if user, pass, ok := strings.Cut(v, ":"); ok {
			c.RedisUsername, c.RedisPassword = user, pass
		} else {
			c.RedisPassword = v
		}
	}
	raw := getenv("REDIS_URL")
	if raw == "" {
		return nil
	}
	tlsOn := false
	if v := getenv("REDIS_TLS"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("%w: REDIS_TLS=%q: not a boolean", errUsage, v)
		}
		tlsOn = b
	}
	s := ""
	if tlsOn {
		s = "s"
	}
	hosts := func(list []string) (string, error) {
		for _, h := range list {
			if strings.TrimSpace(h) == "" || strings.Contains(h, "/") {
				return "", fmt.Errorf("%w: REDIS_URL=%q: want host:port entries", errUsage, raw)
			}
		}
		return strings.Join(list, ","), nil
	}
	switch t := strings.ToLower(getenv("REDIS_TYPE")); t {
	case "", "single":
		switch sock := strings.ToLower(getenv("REDIS_SOCKET_TYPE")); {
		case sock == "unix" || (sock == "" && strings.HasPrefix(raw, "/")):
			if tlsOn {
				return fmt.Errorf("%w: REDIS_TLS over a unix socket is not supported", errUsage)
			}
			c.RedisURL = "unix://" + raw
		case sock == "" || sock == "tcp":
			h, err := hosts([]string{raw})
			if err != nil {
				return err
			}
			c.RedisURL = "redis" + s + "://" + h
		default:
			return fmt.Errorf("%w: REDIS_SOCKET_TYPE=%q: want tcp or unix", errUsage, sock)
		}
	case "sentinel":
		parts := strings.Split(raw, ",")
		if len(parts) < 2 || parts[0] == "" {
			return fmt.Errorf("%w: REDIS_URL=%q: want master,host:port[,host:port...] with REDIS_TYPE=SENTINEL", errUsage, raw)
		}
		h, err := hosts(parts[1:])
		if err != nil {
			return err
		}
		c.RedisURL = "redis" + s + "-sentinel://" + h + "/" + url.PathEscape(parts[0])
	case "cluster":
		h, err := hosts(strings.Split(raw, ","))
		if err != nil {
			return err
		}
		c.RedisURL = "redis" + s + "-cluster://" + h
	default:
		return fmt.Errorf("%w: REDIS_TYPE=%q: want SINGLE, SENTINEL or CLUSTER", errUsage, t)
	}
	c.Store = "redis"
	return nil
}

// checkRedis validates the Redis settings of c without connecting.
func checkRedis(c serveConfig) error {
	if c.RedisURL == "" {
		return fmt.Errorf("%w: --store redis needs --redis-url", errUsage)
	}
	if c.RedisPoolSize < 0 {
		return fmt.Errorf("%w: --redis-pool-size must not be negative", errUsage)
	}
	if c.RedisTimeout <= 0 {
		return fmt.Errorf("%w: --redis-timeout must be positive", errUsage)
	}
	if err := redisbackend.Check(backendOptions(c, memstore.Options{}, nil)); err != nil {
		if strings.HasPrefix(c.RedisURL, "unix://") && c.RedisCluster {
			return fmt.Errorf("%w: --redis-cluster with a unix socket", errUsage)
		}
		return fmt.Errorf("%w: --redis-url: %v", errUsage, err)
	}
	return nil
}

// backendOptions maps c to the Redis backend's options.
func backendOptions(c serveConfig, local memstore.Options, log *slog.Logger) redisbackend.Options {
	return redisbackend.Options{
		URL:         c.RedisURL,
		Cluster:     c.RedisCluster,
		Username:    c.RedisUsername,
		Password:    c.RedisPassword,
		PoolSize:    c.RedisPoolSize,
		Timeout:     c.RedisTimeout,
		FailureMode: c.FailureMode,
		Local:       local,
		Logger:      log,
	}
}
