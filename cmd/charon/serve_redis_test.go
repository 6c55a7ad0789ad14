package main

import (
	"io"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/charonlimit/charon/internal/store/resilient"
)

func TestParseServeRedis(t *testing.T) {
	def := defaultServeConfig()
	with := func(f func(c *serveConfig)) serveConfig {
		c := def
		f(&c)
		return c
	}
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want serveConfig
	}{
		{"flags", []string{"--store", "redis", "--redis-url", "redis://h:1/2", "--redis-cluster", "--redis-pool-size", "7",
			"--redis-timeout", "5ms", "--failure-mode", "unavailable"}, nil,
			with(func(c *serveConfig) {
				c.Store, c.Redis.URL, c.Redis.Cluster, c.Redis.PoolSize = "redis", "redis://h:1/2", true, 7
				c.Redis.Options.Timeout, c.Redis.Options.FailureMode = 5*time.Millisecond, resilient.ModeUnavailable
			})},
		{"charon env", nil, map[string]string{"CHARON_STORE": "redis", "CHARON_REDIS_URL": "redis-cluster://a:1,b:2",
			"CHARON_REDIS_POOL_SIZE": "3", "CHARON_REDIS_TIMEOUT": "20ms", "CHARON_FAILURE_MODE": "open"},
			with(func(c *serveConfig) {
				c.Store, c.Redis.URL, c.Redis.PoolSize = "redis", "redis-cluster://a:1,b:2", 3
				c.Redis.Options.Timeout, c.Redis.Options.FailureMode = 20*time.Millisecond, resilient.ModeOpen
			})},
		{"lyft single tcp", nil, map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis:6379",
			"REDIS_POOL_SIZE": "5", "REDIS_AUTH": "secret"},
			with(func(c *serveConfig) {
				c.Store, c.Redis.URL, c.Redis.PoolSize, c.Redis.Password = "redis", "redis://redis:6379", 5, "secret"
			})},
		{"lyft single tls with user", nil, map[string]string{"BACKEND_TYPE": "redis", "REDIS_URL": "redis:6379",
			"REDIS_TLS": "true", "REDIS_AUTH": "u:p:w"},
			with(func(c *serveConfig) {
				c.Store, c.Redis.URL, c.Redis.Username, c.Redis.Password = "redis", "rediss://redis:6379", "u", "p:w"
			})},
		{"lyft unix socket", nil, map[string]string{"REDIS_SOCKET_TYPE": "unix", "REDIS_URL": "/var/run/redis.sock"},
			with(func(c *serveConfig) { c.Store, c.Redis.URL = "redis", "unix:///var/run/redis.sock" })},
		{"lyft sentinel", nil, map[string]string{"REDIS_TYPE": "SENTINEL", "REDIS_URL": "mymaster,s1:26379,s2:26379"},
			with(func(c *serveConfig) { c.Store, c.Redis.URL = "redis", "redis-sentinel://s1:26379,s2:26379/mymaster" })},
		{"lyft cluster tls", nil, map[string]string{"REDIS_TYPE": "cluster", "REDIS_URL": "a:7000,b:7001", "REDIS_TLS": "1"},
			with(func(c *serveConfig) { c.Store, c.Redis.URL = "redis", "rediss-cluster://a:7000,b:7001" })},
		{"charon beats lyft", []string{"--redis-url", "redis://flag:1"}, map[string]string{"REDIS_URL": "lyft:1",
			"CHARON_REDIS_URL": "redis://env:1"},
			with(func(c *serveConfig) { c.Store, c.Redis.URL = "redis", "redis://flag:1" })},
		{"store memory beats lyft", []string{"--store", "memory"}, map[string]string{"REDIS_URL": "lyft:1"},
			with(func(c *serveConfig) { c.Redis.URL = "redis://lyft:1" })},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseServe(tc.args, envOf(tc.env), io.Discard)
			if err != nil {
				t.Fatalf("parseServe: %v", err)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("config (-want +got):\n%s", d)
			}
		})
	}
}

func TestParseServeRedisErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
	}{
		{"bad scheme", []string{"--store", "redis", "--redis-url", "http://h:1"}, nil},
		{"sentinel without master", []string{"--store", "redis", "--redis-url", "redis-sentinel://h:1"}, nil},
		{"negative pool", []string{"--store", "redis", "--redis-url", "redis://h:1", "--redis-pool-size", "-1"}, nil},
		{"zero timeout", []string{"--store", "redis", "--redis-url", "redis://h:1", "--redis-timeout", "0s"}, nil},
		{"bad mode", []string{"--failure-mode", "maybe"}, nil},
		{"bad mode env", nil, map[string]string{"CHARON_FAILURE_MODE": "maybe"}},
		{"memcache backend", nil, map[string]string{"BACKEND_TYPE": "memcache"}},
		{"bad redis type", nil, map[string]string{"REDIS_TYPE": "ring", "REDIS_URL": "h:1"}},
		{"sentinel without hosts", nil, map[string]string{"REDIS_TYPE": "SENTINEL", "REDIS_URL": "mymaster"}},
		{"bad pool env", nil, map[string]string{"REDIS_POOL_SIZE": "lots"}},
		{"bad tls env", nil, map[string]string{"REDIS_URL": "h:1", "REDIS_TLS": "sure"}},
		{"bad socket type", nil, map[string]string{"REDIS_URL": "h:1", "REDIS_SOCKET_TYPE": "udp"}},
		{"unix cluster", []string{"--store", "redis", "--redis-url", "unix:///tmp/r.sock", "--redis-cluster"}, nil},
	}
	for _, tc := range tests {
		if _, err := parseServe(tc.args, envOf(tc.env), io.Discard); err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
}
