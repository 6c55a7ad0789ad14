package lyftenv_test

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/charonlimit/charon/internal/lyftenv"
)

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestRead(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want []lyftenv.Flag
	}{
		{"nothing", nil, nil},
		{"runtime root", map[string]string{"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit"},
			[]lyftenv.Flag{{"config", "/data/ratelimit/config", "RUNTIME_ROOT, RUNTIME_SUBDIRECTORY"}}},
		{"runtime subdirectory alone", map[string]string{"RUNTIME_SUBDIRECTORY": "ratelimit"},
			[]lyftenv.Flag{{"config", "/srv/runtime_data/current/ratelimit/config", "RUNTIME_SUBDIRECTORY"}}},
		{"ports", map[string]string{"GRPC_PORT": "9000", "DEBUG_PORT": "7000"},
			[]lyftenv.Flag{{"grpc-addr", ":9000", "GRPC_PORT"}, {"debug-addr", "127.0.0.1:7000", "DEBUG_PORT"}}},
		{"sentinel over TLS", map[string]string{"REDIS_URL": "mymaster,h1:26379,h2:26379", "REDIS_TYPE": "SENTINEL", "REDIS_TLS": "true"},
			[]lyftenv.Flag{{"redis-url", "rediss-sentinel://h1:26379,h2:26379/mymaster", "REDIS_URL"}, {"store", "redis", "REDIS_URL"}}},
		{"hosts", map[string]string{"HOST": "10.0.0.1", "GRPC_HOST": "0.0.0.0", "GRPC_PORT": "9000", "DEBUG_HOST": "0.0.0.0"},
			[]lyftenv.Flag{{"grpc-addr", ":9000", "GRPC_PORT"}, {"http-addr", "10.0.0.1:8080", "HOST"}, {"debug-addr", ":6070", "DEBUG_HOST"}}},
		{"behaviour", map[string]string{"SHADOW_MODE": "true", "LIMIT_RESPONSE_HEADERS_ENABLED": "true", "LIMIT_RESET_HEADER": "X-Reset",
			"NEAR_LIMIT_RATIO": "0.9", "GRPC_MAX_CONNECTION_AGE": "24h", "REDIS_TIMEOUT": "2s", "USE_STATSD": "false", "CONFIG_TYPE": "file"},
			[]lyftenv.Flag{{"shadow-mode", "true", "SHADOW_MODE"}, {"response-headers", "true", "LIMIT_RESPONSE_HEADERS_ENABLED"},
				{"reset-header", "X-Reset", "LIMIT_RESET_HEADER"}, {"near-limit-ratio", "0.9", "NEAR_LIMIT_RATIO"},
				{"grpc-max-connection-age", "24h", "GRPC_MAX_CONNECTION_AGE"}, {"redis-timeout", "2s", "REDIS_TIMEOUT"}}},
		{"modes and tracing", map[string]string{"QUOTA_MODE": "true", "RESPONSE_DYNAMIC_METADATA": "true", "TRACING_ENABLED": "true",
			"TRACING_EXPORTER_PROTOCOL": "grpc", "TRACING_SAMPLING_RATE": "0.5"},
			[]lyftenv.Flag{{"quota-mode", "true", "QUOTA_MODE"}, {"dynamic-metadata", "true", "RESPONSE_DYNAMIC_METADATA"},
				{"tracing", "true", "TRACING_ENABLED"}, {"tracing-protocol", "grpc", "TRACING_EXPORTER_PROTOCOL"},
				{"tracing-sampling-rate", "0.5", "TRACING_SAMPLING_RATE"}}},
		{"statsd: over tcp, gostats' default", map[string]string{"USE_STATSD": "true", "STATSD_PORT": "9125", "STATS_FLUSH_INTERVAL": "5s"},
			[]lyftenv.Flag{{"statsd-addr", "localhost:9125", "USE_STATSD"}, {"statsd-protocol", "tcp", "STATSD_PROTOCOL"},
				{"statsd-flush-interval", "5s", "STATS_FLUSH_INTERVAL"}}},
		{"statsd host alone: USE_STATSD defaults to true there", map[string]string{"STATSD_HOST": "stats.local", "STATS_FLUSH_INTERVAL": "5s"},
			[]lyftenv.Flag{{"statsd-addr", "stats.local:8125", "STATSD_HOST"}, {"statsd-protocol", "tcp", "STATSD_PROTOCOL"},
				{"statsd-flush-interval", "5s", "STATS_FLUSH_INTERVAL"}}},
		{"statsd port alone", map[string]string{"STATSD_PORT": "09125"},
			[]lyftenv.Flag{{"statsd-addr", "localhost:9125", "STATSD_PORT"}, {"statsd-protocol", "tcp", "STATSD_PROTOCOL"}}},
		{"statsd over udp", map[string]string{"USE_STATSD": "true", "STATSD_HOST": "stats.local", "STATSD_PROTOCOL": "udp"},
			[]lyftenv.Flag{{"statsd-addr", "stats.local:8125", "USE_STATSD"}, {"statsd-protocol", "udp", "STATSD_PROTOCOL"}}},
		{"statsd over tcp, said", map[string]string{"STATSD_HOST": "stats.local", "STATSD_PROTOCOL": "tcp"},
			[]lyftenv.Flag{{"statsd-addr", "stats.local:8125", "STATSD_HOST"}, {"statsd-protocol", "tcp", "STATSD_PROTOCOL"}}},
		{"statsd protocol alone", map[string]string{"STATSD_PROTOCOL": "udp"},
			[]lyftenv.Flag{{"statsd-addr", "localhost:8125", "STATSD_PROTOCOL"}, {"statsd-protocol", "udp", "STATSD_PROTOCOL"}}},
		{"statsd host with USE_STATSD=false", map[string]string{"USE_STATSD": "false", "STATSD_HOST": "stats.local", "STATSD_PORT": "9125"}, nil},
		{"statsd protocol with USE_STATSD=false: no effect, as there", map[string]string{"USE_STATSD": "false", "STATSD_PROTOCOL": "bogus"}, nil},
		{"statsd interval alone", map[string]string{"STATS_FLUSH_INTERVAL": "5s"}, nil},
		{"statsd with DISABLE_STATS=true", map[string]string{"DISABLE_STATS": "true", "USE_STATSD": "true", "STATSD_HOST": "stats.local",
			"STATSD_PROTOCOL": "udp"}, nil},
		{"prometheus with DISABLE_STATS=true", map[string]string{"DISABLE_STATS": "true", "USE_PROMETHEUS": "true"}, nil},
		{"statsd with DISABLE_STATS=false", map[string]string{"DISABLE_STATS": "false", "STATSD_HOST": "stats.local"},
			[]lyftenv.Flag{{"statsd-addr", "stats.local:8125", "STATSD_HOST"}, {"statsd-protocol", "tcp", "STATSD_PROTOCOL"}}},
		{"redis tls files without REDIS_TLS", map[string]string{"REDIS_URL": "h:1", "REDIS_TLS_CACERT": "ca.pem",
			"REDIS_TLS_CLIENT_CERT": "c.pem", "REDIS_TLS_CLIENT_KEY": "k.pem", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION": "true"},
			[]lyftenv.Flag{{"redis-url", "redis://h:1", "REDIS_URL"}, {"store", "redis", "REDIS_URL"}}},
		{"redis tls files with REDIS_TLS=false", map[string]string{"REDIS_URL": "h:1", "REDIS_TLS": "false", "REDIS_TLS_CACERT": "ca.pem",
			"REDIS_TLS_CLIENT_CERT": "c.pem", "REDIS_TLS_CLIENT_KEY": "k.pem", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION": "true"},
			[]lyftenv.Flag{{"redis-url", "redis://h:1", "REDIS_URL"}, {"store", "redis", "REDIS_URL"}}},
		{"redis tls files with REDIS_PERSECOND_TLS=true only", map[string]string{"REDIS_URL": "h:1", "REDIS_PERSECOND_TLS": "true",
			"REDIS_TLS_CACERT": "ca.pem"},
			[]lyftenv.Flag{{"redis-url", "redis://h:1", "REDIS_URL"}, {"store", "redis", "REDIS_URL"}}},
		{"redis tls files with REDIS_TLS=true", map[string]string{"REDIS_URL": "h:1", "REDIS_TLS": "true", "REDIS_TLS_CACERT": "ca.pem",
			"REDIS_TLS_CLIENT_CERT": "c.pem", "REDIS_TLS_CLIENT_KEY": "k.pem", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION": "true"},
			[]lyftenv.Flag{{"redis-tls-ca", "ca.pem", "REDIS_TLS_CACERT"}, {"redis-tls-cert", "c.pem", "REDIS_TLS_CLIENT_CERT"},
				{"redis-tls-key", "k.pem", "REDIS_TLS_CLIENT_KEY"}, {"redis-tls-skip-hostname", "true", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION"},
				{"redis-url", "rediss://h:1", "REDIS_URL"}, {"store", "redis", "REDIS_URL"}}},
		{"counting refused hits, as envoyproxy/ratelimit's default", map[string]string{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "false"},
			[]lyftenv.Flag{{"overdraft", "true", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT"}}},
		{"refused hits not counted: Charon's default", map[string]string{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "true"}, nil},
		{"prometheus", map[string]string{"USE_PROMETHEUS": "true", "PROMETHEUS_PATH": "/stats"},
			[]lyftenv.Flag{{"metrics-addr", ":9090", "USE_PROMETHEUS"}, {"metrics-path", "/stats", "PROMETHEUS_PATH"}}},
		{"prometheus as Envoy Gateway sets it", map[string]string{"USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": ":19001",
			"PROMETHEUS_MAPPER_YAML": "/etc/statsd-exporter/conf.yaml"},
			[]lyftenv.Flag{{"metrics-addr", ":19001", "USE_PROMETHEUS"}, {"metrics-path", "/metrics", "PROMETHEUS_PATH"},
				{"metrics-mapping", "/etc/statsd-exporter/conf.yaml", "PROMETHEUS_MAPPER_YAML"}}},
		{"prometheus mapping without USE_PROMETHEUS: no effect, as there", map[string]string{"PROMETHEUS_MAPPER_YAML": "m.yaml"}, nil},
		{"milliseconds beside a mapping file: no effect, as there", map[string]string{"USE_PROMETHEUS": "true",
			"PROMETHEUS_MAPPER_YAML": "m.yaml", "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS": "true"},
			[]lyftenv.Flag{{"metrics-addr", ":9090", "USE_PROMETHEUS"}, {"metrics-path", "/metrics", "PROMETHEUS_PATH"},
				{"metrics-mapping", "m.yaml", "PROMETHEUS_MAPPER_YAML"}}},
		{"xDS with envoyproxy/ratelimit's defaults; RUNTIME_* have no effect then", map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "RUNTIME_ROOT": "/data"},
			[]lyftenv.Flag{{"config-xds", "localhost:18000", "CONFIG_TYPE=GRPC_XDS_SOTW"}, {"config-xds-backoff-initial", "10s", "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL"},
				{"config-xds-backoff-factor", "0.5", "XDS_CLIENT_BACKOFF_RANDOM_FACTOR"}}},
		{"xDS, every variable", map[string]string{"CONFIG_TYPE": "grpc_xds_sotw", "CONFIG_GRPC_XDS_SERVER_URL": "cp:18000",
			"CONFIG_GRPC_XDS_NODE_ID": "rl", "CONFIG_GRPC_XDS_NODE_METADATA": "zone=a,team=b", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": "authorization:Bearer x",
			"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL": "1s", "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": "2s", "XDS_CLIENT_BACKOFF_MAX_INTERVAL": "30s",
			"XDS_CLIENT_BACKOFF_RANDOM_FACTOR": "1.5", "XDS_CLIENT_BACKOFF_JITTER": "false", "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES": "8388608",
			"FORCE_START_WITHOUT_INITIAL_CONFIG": "true", "CONFIG_GRPC_XDS_SERVER_USE_TLS": "true", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT": "c.pem",
			"CONFIG_GRPC_XDS_CLIENT_TLS_KEY": "k.pem", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT": "ca.pem", "CONFIG_GRPC_XDS_SERVER_TLS_SAN": "cp.example"},
			[]lyftenv.Flag{{"config-xds", "cp:18000", "CONFIG_GRPC_XDS_SERVER_URL"}, {"config-xds-node-id", "rl", "CONFIG_GRPC_XDS_NODE_ID"},
				{"config-xds-node-metadata", "zone=a,team=b", "CONFIG_GRPC_XDS_NODE_METADATA"},
				{"config-xds-headers", "authorization:Bearer x", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS"},
				{"config-xds-backoff-initial", "2s", "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL"}, {"config-xds-backoff-max", "30s", "XDS_CLIENT_BACKOFF_MAX_INTERVAL"},
				{"config-xds-backoff-factor", "1.5", "XDS_CLIENT_BACKOFF_RANDOM_FACTOR"}, {"config-xds-backoff-jitter", "false", "XDS_CLIENT_BACKOFF_JITTER"},
				{"config-xds-force-start", "true", "FORCE_START_WITHOUT_INITIAL_CONFIG"},
				{"config-xds-max-msg-size", "8388608", "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES"}, {"config-xds-tls", "true", "CONFIG_GRPC_XDS_SERVER_USE_TLS"},
				{"config-xds-tls-cert", "c.pem", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT"}, {"config-xds-tls-key", "k.pem", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY"},
				{"config-xds-tls-ca", "ca.pem", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT"}, {"config-xds-tls-server-name", "cp.example", "CONFIG_GRPC_XDS_SERVER_TLS_SAN"}}},
		{"xDS TLS files without CONFIG_GRPC_XDS_SERVER_USE_TLS have no effect, as there", map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW",
			"CONFIG_GRPC_XDS_SERVER_TLS_CACERT": "ca.pem", "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES": "0"},
			[]lyftenv.Flag{{"config-xds", "localhost:18000", "CONFIG_TYPE=GRPC_XDS_SOTW"}, {"config-xds-backoff-initial", "10s", "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL"},
				{"config-xds-backoff-factor", "0.5", "XDS_CLIENT_BACKOFF_RANDOM_FACTOR"}}},
		{"xDS variables without CONFIG_TYPE=GRPC_XDS_SOTW have no effect, as there", map[string]string{"CONFIG_GRPC_XDS_SERVER_URL": "cp:18000",
			"FORCE_START_WITHOUT_INITIAL_CONFIG": "true", "RUNTIME_ROOT": "/data"},
			[]lyftenv.Flag{{"config", "/data/config", "RUNTIME_ROOT"}}},
		{"cluster", map[string]string{"REDIS_URL": "a:1,b:2", "REDIS_TYPE": "cluster", "REDIS_POOL_SIZE": "7"},
			[]lyftenv.Flag{{"redis-pool-size", "7", "REDIS_POOL_SIZE"}, {"redis-url", "redis-cluster://a:1,b:2", "REDIS_URL"}, {"store", "redis", "REDIS_URL"}}},
	} {
		s, err := lyftenv.Read(envOf(tc.env))
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if d := cmp.Diff(tc.want, s.Flags); d != "" {
			t.Errorf("%s: flags (-want +got):\n%s", tc.name, d)
		}
	}
	s, err := lyftenv.Read(envOf(map[string]string{"REDIS_AUTH": "u:p", "LOG_LEVEL": "debug"}))
	if err != nil || s.RedisUsername != "u" || s.RedisPassword != "p" || s.LogLevel != "debug" || len(s.Flags) != 0 {
		t.Errorf("REDIS_AUTH, LOG_LEVEL: %+v %v", s, err)
	}
	for env, name := range map[string]string{"PORT": "PORT", "BACKEND_TYPE": "BACKEND_TYPE", "REDIS_TYPE": "REDIS_TYPE", "REDIS_TLS": "REDIS_TLS"} {
		m := map[string]string{env: "bogus", "REDIS_URL": "h:1"}
		if _, err := lyftenv.Read(envOf(m)); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s=bogus: %v, want an error naming %s", env, err, name)
		}
	}
	for _, tc := range []struct {
		env  map[string]string
		name string
	}{
		{map[string]string{"REDIS_TLS": "bogus"}, "REDIS_TLS"},
		{map[string]string{"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION": "bogus"}, "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION"},
		{map[string]string{"STATSD_PORT": "statsd"}, "STATSD_PORT"},
		{map[string]string{"USE_STATSD": "true", "STATSD_PORT": "70000"}, "STATSD_PORT"},
		{map[string]string{"STATSD_HOST": "h", "USE_STATSD": "bogus"}, "USE_STATSD"},
		{map[string]string{"STATSD_HOST": "h", "DISABLE_STATS": "bogus"}, "DISABLE_STATS"},
		{map[string]string{"USE_STATSD": "true", "STATSD_PROTOCOL": "bogus"}, "STATSD_PROTOCOL"},
		{map[string]string{"STATSD_HOST": "h", "STATSD_PROTOCOL": "TCP"}, "STATSD_PROTOCOL"},
		{map[string]string{"STATSD_PROTOCOL": "tcp4"}, "STATSD_PROTOCOL"},
		{map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES": "big"}, "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES"},
		{map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_USE_TLS": "yes please"}, "CONFIG_GRPC_XDS_SERVER_USE_TLS"},
		{map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "XDS_CLIENT_BACKOFF_JITTER": "maybe"}, "XDS_CLIENT_BACKOFF_JITTER"},
	} {
		if _, err := lyftenv.Read(envOf(tc.env)); err == nil || !strings.Contains(err.Error(), tc.name) {
			t.Errorf("%v: got %v, want an error naming %s", tc.env, err, tc.name)
		}
	}
}

// lyftVariables are the variables of envoyproxy/ratelimit's
// src/settings/settings.go.
var lyftVariables = strings.Fields(`HOST PORT DEBUG_HOST DEBUG_PORT GRPC_UDS GRPC_HOST GRPC_PORT
GRPC_MAX_CONNECTION_AGE GRPC_MAX_CONNECTION_AGE_GRACE GRPC_SERVER_USE_TLS GRPC_SERVER_TLS_CERT
GRPC_SERVER_TLS_KEY GRPC_CLIENT_TLS_CACERT GRPC_CLIENT_TLS_SAN LOG_LEVEL LOG_FORMAT CONFIG_TYPE
FORCE_START_WITHOUT_INITIAL_CONFIG CONFIG_GRPC_XDS_NODE_ID CONFIG_GRPC_XDS_NODE_METADATA
CONFIG_GRPC_XDS_SERVER_URL CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL
CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS CONFIG_GRPC_XDS_SERVER_USE_TLS CONFIG_GRPC_XDS_CLIENT_TLS_CERT
CONFIG_GRPC_XDS_CLIENT_TLS_KEY CONFIG_GRPC_XDS_SERVER_TLS_CACERT CONFIG_GRPC_XDS_SERVER_TLS_SAN
XDS_CLIENT_BACKOFF_INITIAL_INTERVAL XDS_CLIENT_BACKOFF_MAX_INTERVAL XDS_CLIENT_BACKOFF_RANDOM_FACTOR
XDS_CLIENT_BACKOFF_JITTER XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES USE_DOG_STATSD USE_DOG_STATSD_MOGRIFIERS
USE_STATSD STATSD_HOST STATSD_PORT EXTRA_TAGS STATS_FLUSH_INTERVAL DISABLE_STATS USE_PROMETHEUS
PROMETHEUS_ADDR PROMETHEUS_PATH PROMETHEUS_MAPPER_YAML PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS
RUNTIME_ROOT RUNTIME_SUBDIRECTORY RUNTIME_APPDIRECTORY RUNTIME_IGNOREDOTFILES RUNTIME_WATCH_ROOT
EXPIRATION_JITTER_MAX_SECONDS LOCAL_CACHE_SIZE_IN_BYTES NEAR_LIMIT_RATIO CACHE_KEY_PREFIX BACKEND_TYPE
STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT LIMIT_RESPONSE_HEADERS_ENABLED LIMIT_LIMIT_HEADER
LIMIT_REMAINING_HEADER LIMIT_RESET_HEADER HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED REDIS_SOCKET_TYPE
REDIS_TYPE REDIS_URL REDIS_POOL_SIZE REDIS_AUTH REDIS_TLS REDIS_TLS_CLIENT_CERT REDIS_TLS_CLIENT_KEY
REDIS_TLS_CACERT REDIS_TLS_SKIP_HOSTNAME_VERIFICATION REDIS_PIPELINE_WINDOW REDIS_PIPELINE_LIMIT
REDIS_CLUSTER_PIPELINE_PARALLELISM REDIS_PERSECOND REDIS_PERSECOND_SOCKET_TYPE REDIS_PERSECOND_TYPE
REDIS_PERSECOND_URL REDIS_PERSECOND_POOL_SIZE REDIS_PERSECOND_AUTH REDIS_PERSECOND_TLS
REDIS_SENTINEL_AUTH REDIS_PERSECOND_SENTINEL_AUTH REDIS_PERSECOND_PIPELINE_WINDOW
REDIS_PERSECOND_PIPELINE_LIMIT REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM
REDIS_HEALTH_CHECK_ACTIVE_CONNECTION REDIS_TIMEOUT REDIS_PERSECOND_TIMEOUT REDIS_POOL_ON_EMPTY_BEHAVIOR
REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR REDIS_STARTUP_INITIAL_INTERVAL REDIS_STARTUP_MAX_INTERVAL
REDIS_STARTUP_MAX_ELAPSED_TIME MEMCACHE_HOST_PORT MEMCACHE_MAX_IDLE_CONNS MEMCACHE_SRV
MEMCACHE_SRV_REFRESH MEMCACHE_TLS MEMCACHE_TLS_CLIENT_CERT MEMCACHE_TLS_CLIENT_KEY MEMCACHE_TLS_CACERT
MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION SHADOW_MODE QUOTA_MODE RESPONSE_DYNAMIC_METADATA
MERGE_DOMAIN_CONFIG TRACING_ENABLED TRACING_SERVICE_NAME TRACING_SERVICE_NAMESPACE
TRACING_SERVICE_INSTANCE_ID TRACING_EXPORTER_PROTOCOL TRACING_SAMPLING_RATE`)

// gostatsVariables are the variables github.com/lyft/gostats (v0.4.14, its
// settings.go) reads for the statsd sink envoyproxy/ratelimit builds with
// NewTCPStatsdSink that envoyproxy/ratelimit's settings.go does not:
// the sink's transport.
var gostatsVariables = []string{"STATSD_PROTOCOL"}

// TestEveryVariableHasADisposition: the table covers exactly
// envoyproxy/ratelimit's variables, and docs/migration.md's table lists each.
func TestEveryVariableHasADisposition(t *testing.T) {
	want := slices.Concat(lyftVariables, gostatsVariables)
	slices.Sort(want)
	if d := cmp.Diff(want, lyftenv.Names()); d != "" {
		t.Errorf("variables (-envoyproxy/ratelimit +table):\n%s", d)
	}
	doc, err := os.ReadFile("../../docs/migration.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range want {
		if !strings.Contains(string(doc), "`"+n+"`") {
			t.Errorf("docs/migration.md does not list %s", n)
		}
	}
}

// TestRefusals: a value asking for what Charon does not do stops the
// start, naming the variable and why; the same variables off are accepted.
func TestRefusals(t *testing.T) {
	for env, want := range map[string]string{
		"USE_DOG_STATSD":  "DogStatsD",
		"REDIS_PERSECOND": "per-second", "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS": "seconds only: set it to false (or unset it)",
	} {
		if _, err := lyftenv.Read(envOf(map[string]string{env: "true"})); err == nil || !strings.Contains(err.Error(), env+`="true"`) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s=true: %v, want a refusal naming it and %q", env, err, want)
		}
		if _, err := lyftenv.Read(envOf(map[string]string{env: "false"})); err != nil {
			t.Errorf("%s=false: %v", env, err)
		}
	}
	for env, v := range map[string]string{"GRPC_UDS": "/tmp/s", "CONFIG_TYPE": "GRPC_XDS_DELTA", "REDIS_SENTINEL_AUTH": "x",
		"CACHE_KEY_PREFIX": "p", "DISABLE_STATS": "maybe"} {
		if _, err := lyftenv.Read(envOf(map[string]string{env: v})); err == nil || !strings.Contains(err.Error(), env) {
			t.Errorf("%s=%s: %v, want a refusal naming it", env, v, err)
		}
	}
}

// TestRefusalsNameARemedy: every refusal of a value says what to set
// instead (or to unset the variable), not only why.
func TestRefusalsNameARemedy(t *testing.T) {
	remedies := []string{"unset it", "set it to false", "use ", "want ", "instead"}
	for _, env := range []string{"USE_DOG_STATSD", "EXTRA_TAGS", "USE_DOG_STATSD_MOGRIFIERS", "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
		"REDIS_PERSECOND", "REDIS_SENTINEL_AUTH", "CACHE_KEY_PREFIX", "GRPC_UDS", "CONFIG_TYPE"} {
		_, err := lyftenv.Read(envOf(map[string]string{env: "true"}))
		if err == nil {
			t.Errorf("%s=true: accepted, want a refusal", env)
			continue
		}
		if !slices.ContainsFunc(remedies, func(r string) bool { return strings.Contains(err.Error(), r) }) {
			t.Errorf("%s=true: %q names no remedy (one of %q)", env, err, remedies)
		}
	}
}
