package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/internal/store/redisstore"
	"github.com/charonlimit/charon/internal/store/resilient"
	"github.com/charonlimit/charon/server"
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
	if strings.HasPrefix(c.RedisURL, "unix://") {
		if c.RedisCluster {
			return fmt.Errorf("%w: --redis-cluster with a unix socket", errUsage)
		}
		if _, err := redis.ParseURL(c.RedisURL); err != nil {
			return fmt.Errorf("%w: --redis-url: %v", errUsage, err)
		}
		return nil
	}
	if _, err := redisstore.ClientOptions(redisOptions(c)); err != nil {
		return fmt.Errorf("%w: --redis-url: %v", errUsage, err)
	}
	return nil
}

func redisOptions(c serveConfig) redisstore.Options {
	return redisstore.Options{
		URL:      c.RedisURL,
		Cluster:  c.RedisCluster,
		Username: c.RedisUsername,
		Password: c.RedisPassword,
		PoolSize: c.RedisPoolSize,
	}
}

// openRedis returns the Redis store of c (not connected yet: go-redis
// dials on first use).
func openRedis(c serveConfig) (resilient.Remote, error) {
	if !strings.HasPrefix(c.RedisURL, "unix://") {
		return redisstore.New(redisOptions(c))
	}
	o, err := redis.ParseURL(c.RedisURL)
	if err != nil {
		return nil, err
	}
	if c.RedisUsername != "" {
		o.Username = c.RedisUsername
	}
	if c.RedisPassword != "" {
		o.Password = c.RedisPassword
	}
	if c.RedisPoolSize > 0 {
		o.PoolSize = c.RedisPoolSize
	}
	o.ContextTimeoutEnabled = true
	cl := redis.NewClient(o)
	s, err := redisstore.NewWithClient(cl, redisstore.Options{})
	if err != nil {
		cl.Close()
		return nil, err
	}
	return &ownedClient{Store: s, c: cl}, nil
}

// ownedClient is a Redis store over a client it closes.
type ownedClient struct {
	*redisstore.Store
	c *redis.Client
}

func (o *ownedClient) Close() error {
	return errors.Join(o.Store.Close(), o.c.Close())
}

// serveStore is the store `charon serve` decides with: the in-memory store,
// or the Redis store behind resilient's deadline, breaker, failure mode and
// over-limit cache.
type serveStore struct {
	engineStore store.Store
	mem         *memstore.Store
	res         *resilient.Store
	wake        chan struct{} // breaker transitions
}

func openStore(c serveConfig, log *slog.Logger) (*serveStore, error) {
	local := memstore.Options{MaxKeys: c.MaxKeys, SweepInterval: 10 * time.Second}
	if c.Store != "redis" {
		m := memstore.New(local)
		return &serveStore{engineStore: m, mem: m}, nil
	}
	remote, err := openRedis(c)
	if err != nil {
		return nil, fmt.Errorf("redis store: %w", err)
	}
	s := &serveStore{wake: make(chan struct{}, 1)}
	s.res = resilient.New(remote, resilient.Options{
		Mode:    c.FailureMode,
		Timeout: c.RedisTimeout,
		Local:   local,
		OnBreakerChange: func(resilient.BreakerState) {
			select {
			case s.wake <- struct{}{}:
			default:
			}
		},
	})
	s.engineStore = s.res
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := remote.Ping(ctx); err != nil {
		log.Warn("redis does not answer yet; deciding by the failure mode until it does",
			"failure_mode", c.FailureMode.String(), "err", err.Error())
	}
	log.Info("store", "kind", "redis", "failure_mode", c.FailureMode.String(), "timeout", c.RedisTimeout)
	return s, nil
}

func (s *serveStore) close() {
	if s.res != nil {
		s.res.Close()
	}
	if s.mem != nil {
		s.mem.Close()
	}
}

func (s *serveStore) metrics() *server.Metrics {
	if s.mem != nil {
		mem := s.mem
		return server.NewMetrics(func() float64 { return float64(mem.Evictions()) })
	}
	m := server.NewMetrics(nil)
	m.RegisterStore(s.res.Stats)
	return m
}

// wrap returns the Decider the server uses: with the Redis store, every
// configuration applied also flushes the over-limit cache.
func (s *serveStore) wrap(e *engine.Engine) server.Decider {
	if s.res == nil {
		return e
	}
	return flushOnReload{e, s.res}
}

// flushOnReload is an engine whose SetTree flushes the over-limit cache once
// the new tree is in force.
type flushOnReload struct {
	*engine.Engine
	res *resilient.Store
}

func (f flushOnReload) SetTree(t *descriptors.Tree) {
	f.Engine.SetTree(t)
	f.res.Flush()
}

// watch keeps the server's health equal to the store's Serving (NOT_SERVING
// only in the unavailable mode while Redis is down), probes Redis (PING, and
// the decide function loaded again if Redis lost it) as soon as the
// breaker's cool-off is over, which is how the store recovers, and logs
// breaker transitions. The returned function stops it.
func (s *serveStore) watch(ctx context.Context, srv *server.Server, log *slog.Logger) func() {
	if s.res == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(resilient.DefaultCoolOff / 10) // Probe is a no-op until the cool-off ends
		defer tick.Stop()
		serving, breaker := true, resilient.BreakerClosed
		update := func() {
			if b := s.res.Stats().Breaker; b != breaker {
				breaker = b
				if b == resilient.BreakerOpen {
					log.Warn("redis store failing: circuit breaker open", "failure_mode", s.res.Mode().String())
				} else {
					log.Info("redis store circuit breaker "+b.String(), "failure_mode", s.res.Mode().String())
				}
			}
			if v := s.res.Serving(); v != serving {
				serving = v
				srv.SetServing(v)
			}
		}
		for {
			select {
			case <-ctx.Done():
				return
			case <-s.wake:
			case <-tick.C:
				_ = s.res.Probe(ctx)
			}
			update()
		}
	}()
	return func() {
		cancel()
		wg.Wait()
	}
}
