package main

import (
	"bytes"
	"flag"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/charonlimit/charon/internal/memlimit"
	"github.com/charonlimit/charon/internal/statsd"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/internal/store/resilient"
	"github.com/charonlimit/charon/internal/xdsconfig"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestParseServePrecedence(t *testing.T) {
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
		{"defaults", nil, nil, def},
		{"flags", []string{"--config", "/c", "--grpc-addr", ":1", "--http-addr", ":2", "--debug-addr", ":3",
			"--max-descriptors", "8", "--max-keys", "100", "--response-headers", "--merge-domains", "--shutdown-timeout", "3s", "--fixed-window", "--heap-floor-mib", "0"}, nil,
			with(func(c *serveConfig) {
				c.ConfigDir, c.Server.GRPCAddr, c.Server.HTTPAddr, c.Server.DebugAddr = "/c", ":1", ":2", ":3"
				c.Load.FixedWindowDefault = true
				c.HeapFloorMiB = 0
				c.MaxKeysSet, c.HeapFloorSet = true, true
				c.MaxDescriptors, c.MaxKeys, c.RLS.ResponseHeaders, c.Load.MergeDomains, c.Server.ShutdownTimeout = 8, 100, true, true, 3*time.Second
			})},
		{"charon env", nil, map[string]string{
			"CHARON_CONFIG": "/e", "CHARON_GRPC_ADDR": ":11", "CHARON_HTTP_ADDR": ":12", "CHARON_DEBUG_ADDR": ":13",
			"CHARON_MAX_DESCRIPTORS": "9", "CHARON_MAX_KEYS": "7", "CHARON_RESPONSE_HEADERS": "true",
			"CHARON_MERGE_DOMAINS": "1", "CHARON_SHUTDOWN_TIMEOUT": "1m", "CHARON_FIXED_WINDOW": "true", "CHARON_STORE": "memory", "CHARON_REDIS_URL": "redis://x",
			"CHARON_HEAP_FLOOR_MIB": "256"},
			with(func(c *serveConfig) {
				c.HeapFloorMiB = 256
				c.MaxKeysSet, c.HeapFloorSet = true, true
				c.ConfigDir, c.Server.GRPCAddr, c.Server.HTTPAddr, c.Server.DebugAddr = "/e", ":11", ":12", ":13"
				c.MaxDescriptors, c.MaxKeys, c.RLS.ResponseHeaders, c.Load.MergeDomains, c.Server.ShutdownTimeout = 9, 7, true, true, time.Minute
				c.Redis.URL = "redis://x"
				c.Load.FixedWindowDefault = true
			})},
		{"Envoy Gateway's prometheus env", nil, map[string]string{
			"USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": ":19001", "PROMETHEUS_MAPPER_YAML": "/etc/statsd-exporter/conf.yaml"},
			with(func(c *serveConfig) {
				c.Server.MetricsAddr, c.Server.MetricsPath, c.MetricsMapping = ":19001", "/metrics", "/etc/statsd-exporter/conf.yaml"
			})},
		{"flag beats env", []string{"--grpc-addr", ":1", "--response-headers=false"},
			map[string]string{"CHARON_GRPC_ADDR": ":11", "GRPC_PORT": "9", "CHARON_RESPONSE_HEADERS": "true"},
			with(func(c *serveConfig) { c.Server.GRPCAddr = ":1" })},
		{"lyft env", nil, map[string]string{
			"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit", "GRPC_PORT": "9081", "PORT": "9080",
			"DEBUG_PORT": "9070", "LOG_LEVEL": "debug", "LOG_FORMAT": "text", "MERGE_DOMAIN_CONFIG": "true"},
			with(func(c *serveConfig) {
				c.ConfigDir, c.Server.GRPCAddr, c.Server.HTTPAddr, c.Server.DebugAddr = "/data/ratelimit/config", ":9081", ":9080", "127.0.0.1:9070"
				c.LogLevel, c.LogFormat, c.Load.MergeDomains = "debug", "text", true
			})},
		{"lyft statsd host alone: over tcp, as gostats", nil, map[string]string{"STATSD_HOST": "stats.local"},
			with(func(c *serveConfig) { c.Statsd.Addr, c.Statsd.Protocol = "stats.local:8125", statsd.TCP })},
		{"lyft statsd port alone", nil, map[string]string{"STATSD_PORT": "9125", "STATS_FLUSH_INTERVAL": "5s"},
			with(func(c *serveConfig) {
				c.Statsd.Addr, c.Statsd.Protocol, c.Statsd.FlushInterval = "localhost:9125", statsd.TCP, 5*time.Second
			})},
		{"lyft statsd over udp", nil, map[string]string{"USE_STATSD": "true", "STATSD_HOST": "stats.local", "STATSD_PROTOCOL": "udp"},
			with(func(c *serveConfig) { c.Statsd.Addr = "stats.local:8125" })},
		{"lyft statsd off", nil, map[string]string{"USE_STATSD": "false", "STATSD_HOST": "stats.local", "STATSD_PORT": "9125"}, def},
		{"lyft stats disabled", nil, map[string]string{"DISABLE_STATS": "true", "USE_STATSD": "true", "STATSD_HOST": "stats.local"}, def},
		{"charon statsd beats lyft", nil, map[string]string{"STATSD_HOST": "stats.local", "CHARON_STATSD_ADDR": "other:1"},
			with(func(c *serveConfig) { c.Statsd.Addr, c.Statsd.Protocol = "other:1", statsd.TCP })},
		{"charon statsd protocol beats lyft", nil, map[string]string{"STATSD_HOST": "stats.local", "CHARON_STATSD_PROTOCOL": "udp"},
			with(func(c *serveConfig) { c.Statsd.Addr = "stats.local:8125" })},
		{"statsd protocol flag", []string{"--statsd-addr", "s:1", "--statsd-protocol", "tcp"}, nil,
			with(func(c *serveConfig) { c.Statsd.Addr, c.Statsd.Protocol = "s:1", statsd.TCP })},
		{"statsd protocol env", nil, map[string]string{"CHARON_STATSD_ADDR": "s:1", "CHARON_STATSD_PROTOCOL": "tcp"},
			with(func(c *serveConfig) { c.Statsd.Addr, c.Statsd.Protocol = "s:1", statsd.TCP })},
		{"statsd protocol flag beats env", []string{"--statsd-protocol=udp"}, map[string]string{"CHARON_STATSD_ADDR": "s:1", "CHARON_STATSD_PROTOCOL": "tcp"},
			with(func(c *serveConfig) { c.Statsd.Addr = "s:1" })},
		{"lyft defaults for root and app dir", nil, map[string]string{"RUNTIME_SUBDIRECTORY": "rl"},
			with(func(c *serveConfig) { c.ConfigDir = "/srv/runtime_data/current/rl/config" })},
		{"lyft app dir", nil, map[string]string{"RUNTIME_ROOT": "/r", "RUNTIME_APPDIRECTORY": "app"},
			with(func(c *serveConfig) { c.ConfigDir = "/r/app" })},
		{"charon env beats lyft env", nil, map[string]string{
			"RUNTIME_ROOT": "/data", "CHARON_CONFIG": "/c", "GRPC_PORT": "9081", "CHARON_GRPC_ADDR": ":1",
			"MERGE_DOMAIN_CONFIG": "true", "CHARON_MERGE_DOMAINS": "false"},
			with(func(c *serveConfig) { c.ConfigDir, c.Server.GRPCAddr = "/c", ":1" })},
		{"flag beats lyft env", []string{"--config", "/f"}, map[string]string{"RUNTIME_ROOT": "/data"},
			with(func(c *serveConfig) { c.ConfigDir = "/f" })},
		{"redis flags", []string{"--store", "redis", "--redis-url", "redis://h:1/2", "--redis-cluster", "--redis-pool-size", "7",
			"--redis-timeout", "5ms", "--failure-mode", "unavailable"}, nil,
			with(func(c *serveConfig) {
				c.Store, c.Redis.URL, c.Redis.Cluster, c.Redis.PoolSize = "redis", "redis://h:1/2", true, 7
				c.Redis.Options.Timeout, c.Redis.Options.FailureMode = 5*time.Millisecond, resilient.ModeUnavailable
			})},
		{"redis charon env", nil, map[string]string{"CHARON_STORE": "redis", "CHARON_REDIS_URL": "redis-cluster://a:1,b:2",
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
			if d := cmp.Diff(tc.want, got, cmpopts.IgnoreUnexported(serveConfig{})); d != "" {
				t.Errorf("config (-want +got):\n%s", d)
			}
		})
	}
}

func TestParseServeErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
	}{
		{"redis without url", []string{"--store", "redis"}, nil},
		{"redis without url from env", nil, map[string]string{"CHARON_STORE": "redis"}},
		{"unknown store", []string{"--store", "disk"}, nil},
		{"bad number env", nil, map[string]string{"CHARON_MAX_DESCRIPTORS": "many"}},
		{"zero descriptors", []string{"--max-descriptors", "0"}, nil},
		{"negative heap floor", []string{"--heap-floor-mib", "-1"}, nil},
		{"state file on redis", []string{"--store", "redis", "--redis-url", "redis://h:1", "--state-file", "s"}, nil},
		{"zero state interval", nil, map[string]string{"CHARON_STATE_INTERVAL": "0s"}},
		{"bad port", nil, map[string]string{"GRPC_PORT": "http"}},
		{"bad merge", nil, map[string]string{"MERGE_DOMAIN_CONFIG": "perhaps"}},
		{"bad log level", nil, map[string]string{"LOG_LEVEL": "loud"}},
		{"bad log format", nil, map[string]string{"LOG_FORMAT": "xml"}},
		{"unknown flag", []string{"--port", "1"}, nil},
		{"stray argument", []string{"dir"}, nil},
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
		{"a directory and xDS", []string{"--config", "/c", "--config-xds", "cp:18000"}, nil},
		{"RUNTIME_ROOT and --config-xds", []string{"--config-xds", "cp:18000"}, map[string]string{"RUNTIME_ROOT": "/data"}},
		{"force start without xDS", []string{"--config-xds-force-start"}, nil},
		{"xDS address without port", []string{"--config-xds", "cp"}, nil},
		{"xDS header without :", nil, map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": "token"}},
		{"xDS backoff max below initial", []string{"--config-xds", "cp:1", "--config-xds-backoff-max", "1ms"}, nil},
		{"xDS backoff factor 0", nil, map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "XDS_CLIENT_BACKOFF_RANDOM_FACTOR": "0"}},
		{"xDS TLS CA missing", []string{"--config-xds", "cp:1", "--config-xds-tls-ca", "/nonexistent/ca.pem"}, nil},
		{"xDS delta", nil, map[string]string{"CONFIG_TYPE": "GRPC_XDS_DELTA"}},
		{"RLQS TTL not whole seconds", []string{"--rlqs-ttl", "2500ms"}, nil},
		{"RLQS TTL not above the interval", []string{"--rlqs-ttl", "1s"}, nil},
		{"RLQS unmatched", nil, map[string]string{"CHARON_RLQS_UNMATCHED": "maybe"}},
		{"RLQS tolerance", []string{"--rlqs-tolerance", "1.5"}, nil},
	}
	for _, tc := range tests {
		if _, err := parseServe(tc.args, envOf(tc.env), io.Discard); err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
	_, err := parseServe([]string{"--store", "redis"}, envOf(nil), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--redis-url") {
		t.Errorf("redis store error %v does not ask for --redis-url", err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--escrow-home", "redis://home:6379"}, "--escrow-home: a region's replicas keep its slices in its Redis: want --store redis"},
		{[]string{"--store", "redis", "--redis-url", "redis://r:6379", "--escrow-home", "ftp://home"}, "--escrow-home: "},
		{[]string{"--store", "redis", "--redis-url", "redis://r:6379", "--escrow-region", "eu"}, "--escrow-region \"eu\": needs --escrow-home"},
	} {
		if _, err := parseServe(tc.args, envOf(nil), io.Discard); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want it to say %q", tc.args, err, tc.want)
		}
	}
	if _, err := parseServe([]string{"--store", "redis", "--redis-url", "redis://r:6379", "--escrow-home", "redis://home:6379", "--escrow-region", "eu"}, envOf(nil), io.Discard); err != nil {
		t.Errorf("a region's settings: %v", err)
	}
}

// TestParseServeConfigSources: a directory and an xDS server both set
// stop the start with an error that names where each came from (flag,
// CHARON_* variable or envoyproxy/ratelimit's variables) and what to
// change for either.
func TestParseServeConfigSources(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want []string
	}{
		{"two flags", []string{"--config", "/c", "--config-xds", "cp:18000"}, nil,
			[]string{"/c is set by --config", "cp:18000 by --config-xds", "from xDS, drop --config;", "the directory, drop --config-xds"}},
		{"CHARON_CONFIG", []string{"--config-xds=cp:18000"}, map[string]string{"CHARON_CONFIG": "/c"},
			[]string{"/c is set by CHARON_CONFIG", "from xDS, unset CHARON_CONFIG;", "drop --config-xds"}},
		{"RUNTIME_ROOT and RUNTIME_SUBDIRECTORY", []string{"--config-xds", "cp:18000"}, map[string]string{"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "rl"},
			[]string{"/data/rl/config is set by RUNTIME_ROOT, RUNTIME_SUBDIRECTORY", "unset RUNTIME_ROOT, RUNTIME_SUBDIRECTORY", "CONFIG_TYPE=GRPC_XDS_SOTW"}},
		{"RUNTIME_SUBDIRECTORY and CHARON_CONFIG_XDS", nil, map[string]string{"RUNTIME_SUBDIRECTORY": "rl", "CHARON_CONFIG_XDS": "cp:18000"},
			[]string{"set by RUNTIME_SUBDIRECTORY", "cp:18000 by CHARON_CONFIG_XDS", "unset RUNTIME_SUBDIRECTORY", "the directory, unset CHARON_CONFIG_XDS"}},
		{"a flag over a variable is the flag's", []string{"--config", "/f", "--config-xds", "cp:18000"}, map[string]string{"CHARON_CONFIG": "/c"},
			[]string{"/f is set by --config", "drop --config;"}},
		{"CHARON_CONFIG and envoyproxy/ratelimit's xDS", nil, map[string]string{"CHARON_CONFIG": "/c", "CONFIG_TYPE": "GRPC_XDS_SOTW"},
			[]string{"localhost:18000 by CONFIG_TYPE=GRPC_XDS_SOTW", "unset CHARON_CONFIG", "the directory, unset CONFIG_TYPE"}},
	} {
		_, err := parseServe(tc.args, envOf(tc.env), io.Discard)
		if err == nil {
			t.Errorf("%s: no error", tc.name)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not say %q", tc.name, err, w)
			}
		}
	}
}

// TestParseServeErrorsNameTheVariable: a refused value that came from a
// variable says which, not only the flag it stands for.
func TestParseServeErrorsNameTheVariable(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{nil, map[string]string{"CHARON_MAX_KEYS": "0"}, "--max-keys must be at least 1 (--max-keys is CHARON_MAX_KEYS)"},
		{nil, map[string]string{"NEAR_LIMIT_RATIO": "2"}, "--near-limit-ratio 2: want more than 0, at most 1 (--near-limit-ratio is NEAR_LIMIT_RATIO)"},
		{nil, map[string]string{"CHARON_SHUTDOWN_TIMEOUT": "0s", "CHARON_TOP_K": "2000"},
			"--shutdown-timeout must be positive (--shutdown-timeout is CHARON_SHUTDOWN_TIMEOUT)\n--top-k 2000: want 0 to 1024 (--top-k is CHARON_TOP_K)"},
		{[]string{"--max-keys", "0"}, map[string]string{"CHARON_MAX_KEYS": "5"}, "--max-keys must be at least 1"},
	} {
		_, err := parseServe(tc.args, envOf(tc.env), io.Discard)
		if err == nil || !strings.HasSuffix(err.Error(), tc.want) {
			t.Errorf("%v %v: %v, want it to end %q", tc.args, tc.env, err, tc.want)
		}
	}
}

// TestWaitingFor: before the first configuration from xDS, the answers
// say which server is awaited, which setting named it, and how to serve
// meanwhile, in the words of the settings used.
func TestWaitingFor(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want []string
	}{
		{"flag", []string{"--config-xds", "cp:18000", "--config-xds-node-id", "rl"}, nil,
			[]string{"xDS server cp:18000 (set by --config-xds, node id \"rl\")", "start with --config-xds-force-start"}},
		{"CHARON_CONFIG_XDS", nil, map[string]string{"CHARON_CONFIG_XDS": "cp:18000"},
			[]string{"(set by CHARON_CONFIG_XDS,", "--config-xds-force-start"}},
		{"envoyproxy/ratelimit's default server", nil, map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW"},
			[]string{"xDS server localhost:18000 (set by CONFIG_TYPE=GRPC_XDS_SOTW,", "FORCE_START_WITHOUT_INITIAL_CONFIG=true"}},
		{"envoyproxy/ratelimit's server URL", nil, map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": "cp:1"},
			[]string{"cp:1 (set by CONFIG_GRPC_XDS_SERVER_URL,", "FORCE_START_WITHOUT_INITIAL_CONFIG=true"}},
	} {
		c, err := parseServe(tc.args, envOf(tc.env), io.Discard)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		for _, w := range tc.want {
			if got := c.waitingFor(); !strings.Contains(got, w) {
				t.Errorf("%s: %q does not say %q", tc.name, got, w)
			}
		}
	}
}

// TestParseServeStatsdProtocolErrors: a protocol other than udp or tcp
// stops the start, naming where it came from.
func TestParseServeStatsdProtocolErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		name string
	}{
		{[]string{"--statsd-protocol", "tcp4"}, nil, "statsd-protocol"},
		{nil, map[string]string{"CHARON_STATSD_PROTOCOL": "TCP"}, "CHARON_STATSD_PROTOCOL"},
		{nil, map[string]string{"STATSD_HOST": "stats.local", "STATSD_PROTOCOL": "unix"}, "STATSD_PROTOCOL"},
	} {
		_, err := parseServe(tc.args, envOf(tc.env), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.name) || !strings.Contains(err.Error(), "udp") {
			t.Errorf("%v %v: got %v, want an error naming %s and the choices", tc.args, tc.env, err, tc.name)
		}
	}
}

// TestParseServeXDS: CONFIG_TYPE=GRPC_XDS_SOTW alone is
// envoyproxy/ratelimit's defaults; its variables yield to CHARON_* and
// flags.
func TestParseServeXDS(t *testing.T) {
	c, err := parseServe(nil, envOf(map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := xdsconfig.DefaultFlags()
	want.Addr = "localhost:18000"
	want.Backoff.Initial, want.Backoff.Factor = 10*time.Second, 0.5
	if d := cmp.Diff(want, c.XDS); d != "" {
		t.Errorf("envoyproxy/ratelimit's defaults (-want +got):\n%s", d)
	}
	c, err = parseServe([]string{"--config-xds-node-id", "flag"}, envOf(map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW",
		"CONFIG_GRPC_XDS_SERVER_URL": "lyft:1", "CHARON_CONFIG_XDS": "charon:2", "CONFIG_GRPC_XDS_NODE_ID": "lyft",
		"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": "authorization:Bearer x,x-team:edge", "FORCE_START_WITHOUT_INITIAL_CONFIG": "true"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.XDS.Addr != "charon:2" || c.XDS.NodeID != "flag" || !c.XDS.ForceStart ||
		!maps.Equal(c.XDS.Headers.M, map[string]string{"authorization": "Bearer x", "x-team": "edge"}) {
		t.Errorf("precedence: %+v", c.XDS)
	}
}

// TestDocsListEveryServeFlag: the flag reference, docs/serve.md, names every
// flag of `charon serve`.
func TestDocsListEveryServeFlag(t *testing.T) {
	ref, err := os.ReadFile("../../docs/serve.md")
	if err != nil {
		t.Fatal(err)
	}
	c := defaultServeConfig()
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	serveFlags(fs, &c)
	fs.VisitAll(func(f *flag.Flag) {
		if !strings.Contains(string(ref), "`--"+f.Name) {
			t.Errorf("docs/serve.md does not list --%s", f.Name)
		}
	})
}

// istioSampleEnv is the environment of Istio's samples/ratelimit
// Deployment of envoyproxy/ratelimit, its ConfigMap mounted at
// /data/ratelimit/config.
var istioSampleEnv = map[string]string{
	"LOG_LEVEL": "debug", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis:6379", "USE_STATSD": "false",
	"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_WATCH_ROOT": "false",
	"RUNTIME_IGNOREDOTFILES": "true",
}

// setDefaultConfigDir sets the compiled-in --config default, as the image's
// build does, for the test.
func setDefaultConfigDir(t *testing.T, dir string) {
	t.Helper()
	old := defaultConfigDir
	defaultConfigDir = dir
	t.Cleanup(func() { defaultConfigDir = old })
}

// TestParseServeConfigDirDefault: a compiled-in --config default (the
// image's examples) is the lowest precedence: envoyproxy/ratelimit's
// RUNTIME_* variables, CHARON_CONFIG and --config each replace it.
func TestParseServeConfigDirDefault(t *testing.T) {
	setDefaultConfigDir(t, "/etc/charon/config")
	with := func(env map[string]string, kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range env {
			m[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"nothing said", nil, nil, "/etc/charon/config"},
		{"Istio's ratelimit sample", nil, istioSampleEnv, "/data/ratelimit/config"},
		{"RUNTIME_SUBDIRECTORY alone", nil, map[string]string{"RUNTIME_SUBDIRECTORY": "rl"}, "/srv/runtime_data/current/rl/config"},
		{"CHARON_CONFIG", nil, map[string]string{"CHARON_CONFIG": "/c"}, "/c"},
		{"CHARON_CONFIG over RUNTIME_*", nil, with(istioSampleEnv, "CHARON_CONFIG", "/c"), "/c"},
		{"--config", []string{"--config", "/f"}, istioSampleEnv, "/f"},
		{"xDS: no directory", nil, map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW"}, ""},
		{"xDS with RUNTIME_* (no effect then, as there)", nil, with(istioSampleEnv, "CONFIG_TYPE", "GRPC_XDS_SOTW"), ""},
		{"--config-xds", []string{"--config-xds", "cp:18000"}, nil, ""},
	} {
		c, err := parseServe(tc.args, envOf(tc.env), io.Discard)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if c.ConfigDir != tc.want {
			t.Errorf("%s: --config %q, want %q", tc.name, c.ConfigDir, tc.want)
		}
	}
}

// TestServeBadMetricsMapping: a mapping file statsd_exporter refuses
// (PROMETHEUS_MAPPER_YAML's) stops the start with an error naming it.
func TestServeBadMetricsMapping(t *testing.T) {
	file := filepath.Join(t.TempDir(), "conf.yaml")
	if err := os.WriteFile(file, []byte("mappings:\n  - match: \"a(\"\n    match_type: regex\n    name: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	code := run([]string{"serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--debug-addr", "127.0.0.1:0"},
		envOf(map[string]string{"USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": "127.0.0.1:0", "PROMETHEUS_MAPPER_YAML": file}), &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "cannot start") || !strings.Contains(errb.String(), file) {
		t.Errorf("exit %d, stderr %q; want exit 1, \"cannot start\" naming %s", code, errb.String(), file)
	}
}

// TestCalendarUnitsFlag: --calendar-units and CHARON_CALENDAR_UNITS give
// the configuration's calendar units; an unknown zone is refused naming
// the flag.
func TestCalendarUnitsFlag(t *testing.T) {
	c, err := parseServe([]string{"--calendar-units", "Europe/Paris"}, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if loc := c.Load.CalendarUnits; loc == nil || loc.String() != "Europe/Paris" {
		t.Errorf("--calendar-units Europe/Paris: %v", loc)
	}
	c, err = parseServe(nil, envOf(map[string]string{"CHARON_CALENDAR_UNITS": "UTC"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if loc := c.Load.CalendarUnits; loc == nil || loc.String() != "UTC" {
		t.Errorf("CHARON_CALENDAR_UNITS=UTC: %v", loc)
	}
	if c, err = parseServe(nil, envOf(nil), io.Discard); err != nil || c.Load.CalendarUnits != nil {
		t.Errorf("by default: %v, %v; want none", c.Load.CalendarUnits, err)
	}
	if _, err := parseServe([]string{"--calendar-units", "Mars/Olympus"}, envOf(nil), io.Discard); err == nil ||
		!strings.Contains(err.Error(), "calendar-units") || !strings.Contains(err.Error(), "Mars/Olympus") {
		t.Errorf("an unknown zone: %v, want an error naming the flag and the zone", err)
	}
}

// TestMemoryBudget: the container's limit, read under CHARON_CGROUP_ROOT, sizes
// GOMEMLIMIT, --heap-floor-mib and --max-keys; an explicit GOMEMLIMIT or flag
// wins; without any limit the floor is memlimit's small default.
func TestMemoryBudget(t *testing.T) {
	const mib = 1 << 20
	limited := t.TempDir() // a cgroup v2 container of 128 MiB, as seen from inside
	if err := os.WriteFile(filepath.Join(limited, "memory.max"), []byte("134217728\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	unlimited := t.TempDir()
	if err := os.WriteFile(filepath.Join(unlimited, "memory.max"), []byte("max\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bad := t.TempDir()
	if err := os.WriteFile(filepath.Join(bad, "memory.max"), []byte("lots\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	const none = math.MaxInt64
	type result struct {
		GoLimit       int64
		From          string
		FloorMiB      int
		MaxKeys       int
		ErrMentioning string
	}
	for _, c := range []struct {
		name    string
		args    []string
		env     map[string]string
		goLimit int64 // the runtime's, as GOMEMLIMIT set it
		want    result
	}{
		{"no limit anywhere", nil, map[string]string{"CHARON_CGROUP_ROOT": unlimited}, none,
			result{none, "none", memlimit.UnlimitedFloorMiB, memstore.DefaultMaxKeys, ""}},
		{"a 128 MiB container", nil, map[string]string{"CHARON_CGROUP_ROOT": limited}, none,
			result{120795955, "container", 28, 120795955 / 2 / memstore.PairBytes, ""}},
		{"flags win", []string{"--heap-floor-mib", "100", "--max-keys", "5000"}, map[string]string{"CHARON_CGROUP_ROOT": limited}, none,
			result{120795955, "container", 100, 5000, ""}},
		{"CHARON_ variables are flags", nil, map[string]string{"CHARON_CGROUP_ROOT": limited, "CHARON_HEAP_FLOOR_MIB": "0", "CHARON_MAX_KEYS": "7"}, none,
			result{120795955, "container", 0, 7, ""}},
		{"GOMEMLIMIT wins over the container", nil, map[string]string{"CHARON_CGROUP_ROOT": limited, "GOMEMLIMIT": "400MiB"}, 400 * mib,
			result{400 * mib, "GOMEMLIMIT", 100, 200 * mib / memstore.PairBytes, ""}},
		{"a limit file that is not a number: as without one, and said", nil, map[string]string{"CHARON_CGROUP_ROOT": bad}, none,
			result{none, "none", memlimit.UnlimitedFloorMiB, memstore.DefaultMaxKeys, "memory.max"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := parseServe(c.args, envOf(c.env), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			b, err := cfg.memoryBudget("0::/\n", c.goLimit)
			got := result{b.GoLimit, b.GoLimitFrom, cfg.HeapFloorMiB, cfg.MaxKeys, ""}
			if err != nil {
				got.ErrMentioning = c.want.ErrMentioning
				if !strings.Contains(err.Error(), c.want.ErrMentioning) || c.want.ErrMentioning == "" {
					t.Errorf("err %v, want one naming %q", err, c.want.ErrMentioning)
				}
			} else if c.want.ErrMentioning != "" {
				t.Errorf("no error, want one naming %q", c.want.ErrMentioning)
			}
			if d := cmp.Diff(c.want, got); d != "" {
				t.Errorf("budget (-want +got):\n%s", d)
			}
		})
	}
}
