package main

import (
	"flag"
	"fmt"
	"log/slog"
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
