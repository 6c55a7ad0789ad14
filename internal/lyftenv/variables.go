package lyftenv

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Every variable of envoyproxy/ratelimit's settings, and STATSD_PROTOCOL
// of the statsd sink it builds with github.com/lyft/gostats, is in
// variables: read
// maps it to a flag, or Charon already behaves as it asks, or it has no
// effect in envoyproxy/ratelimit either in the setup Charon accepts (the
// memcache and per-second Redis ones, and the xDS ones unless
// CONFIG_TYPE=GRPC_XDS_SOTW); a
// value asking for what Charon does not do is refused at start, naming the
// variable and why. Nothing is ignored silently: README.md lists them all.

// responseTimeSeconds is why PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS=true
// is refused, and what to do instead.
const responseTimeSeconds = "Charon serves ratelimit_service_response_time_seconds in seconds only: set it to false (or unset it) " +
	"and multiply by 1000 where a dashboard or alert reads milliseconds; beside PROMETHEUS_MAPPER_YAML it has no effect, as in envoyproxy/ratelimit"

// refusal checks one variable's value (set, not empty); nil accepts it.
type refusal func(v string) error

// onlyOff refuses a boolean that turns on what Charon does not have.
func onlyOff(why string) refusal {
	return func(v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("not a boolean")
		}
		if b {
			return fmt.Errorf("%s", why)
		}
		return nil
	}
}

// notSet refuses any value.
func notSet(why string) refusal {
	return func(string) error { return fmt.Errorf("%s", why) }
}

// aBool accepts booleans only.
func aBool(v string) error {
	if _, err := strconv.ParseBool(v); err != nil {
		return fmt.Errorf("not a boolean")
	}
	return nil
}

// variables are envoyproxy/ratelimit's variables with the check of their
// values (nil: every value is honoured or has no effect, see README.md).
var variables = map[string]refusal{
	// Mapped to flags by read.
	"HOST": nil, "PORT": nil, "DEBUG_HOST": nil, "DEBUG_PORT": nil, "GRPC_HOST": nil, "GRPC_PORT": nil,
	"GRPC_MAX_CONNECTION_AGE": nil, "GRPC_MAX_CONNECTION_AGE_GRACE": nil,
	"GRPC_SERVER_USE_TLS": nil, "GRPC_SERVER_TLS_CERT": nil, "GRPC_SERVER_TLS_KEY": nil,
	"GRPC_CLIENT_TLS_CACERT": nil, "GRPC_CLIENT_TLS_SAN": nil,
	"LOG_LEVEL": nil, "LOG_FORMAT": nil,
	"RUNTIME_ROOT": nil, "RUNTIME_SUBDIRECTORY": nil, "RUNTIME_APPDIRECTORY": nil,
	"NEAR_LIMIT_RATIO": nil, "BACKEND_TYPE": nil, "MERGE_DOMAIN_CONFIG": nil,
	"LIMIT_RESPONSE_HEADERS_ENABLED": nil, "LIMIT_LIMIT_HEADER": nil, "LIMIT_REMAINING_HEADER": nil, "LIMIT_RESET_HEADER": nil,
	"SHADOW_MODE": nil,
	"QUOTA_MODE":  nil, "RESPONSE_DYNAMIC_METADATA": nil,
	"TRACING_ENABLED": nil, "TRACING_SERVICE_NAME": nil, "TRACING_SERVICE_NAMESPACE": nil, "TRACING_SERVICE_INSTANCE_ID": nil,
	"TRACING_EXPORTER_PROTOCOL": nil, "TRACING_SAMPLING_RATE": nil,
	"REDIS_SOCKET_TYPE": nil, "REDIS_TYPE": nil, "REDIS_URL": nil, "REDIS_POOL_SIZE": nil, "REDIS_AUTH": nil,
	"REDIS_TLS": nil, "REDIS_TLS_CLIENT_CERT": nil, "REDIS_TLS_CLIENT_KEY": nil, "REDIS_TLS_CACERT": nil,
	"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION": nil, "REDIS_TIMEOUT": nil,
	"USE_STATSD": aBool, "STATSD_HOST": nil, "STATSD_PORT": nil, "STATS_FLUSH_INTERVAL": nil,
	"USE_PROMETHEUS": aBool, "PROMETHEUS_ADDR": nil, "PROMETHEUS_PATH": nil, "PROMETHEUS_MAPPER_YAML": nil, "DISABLE_STATS": aBool,

	// Read by github.com/lyft/gostats, not settings.go: the transport of
	// its statsd sink, mapped (and checked) by read with statsd on; it has
	// no effect off, there too.
	"STATSD_PROTOCOL": nil,

	// Accepted where Charon behaves as they ask (or it has no such
	// setting); refused where it cannot.
	"GRPC_UDS": notSet("a gRPC listener on a Unix socket is not supported: use GRPC_HOST and GRPC_PORT"),
	"CONFIG_TYPE": func(v string) error {
		if strings.EqualFold(v, "GRPC_XDS_SOTW") {
			return nil
		}
		return onlyValue(v, "FILE", "want FILE (a configuration directory) or GRPC_XDS_SOTW (an xDS server, State of the World)")
	},
	// Mapped to flags by readXDS with CONFIG_TYPE=GRPC_XDS_SOTW; no effect
	// otherwise, there too.
	"FORCE_START_WITHOUT_INITIAL_CONFIG":        aBool,
	"CONFIG_GRPC_XDS_SERVER_URL":                nil,
	"CONFIG_GRPC_XDS_NODE_ID":                   nil,
	"CONFIG_GRPC_XDS_NODE_METADATA":             nil,
	"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": nil,
	"CONFIG_GRPC_XDS_SERVER_USE_TLS":            aBool,
	"CONFIG_GRPC_XDS_CLIENT_TLS_CERT":           nil,
	"CONFIG_GRPC_XDS_CLIENT_TLS_KEY":            nil,
	"CONFIG_GRPC_XDS_SERVER_TLS_CACERT":         nil,
	"CONFIG_GRPC_XDS_SERVER_TLS_SAN":            nil,
	"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL":       nil,
	"XDS_CLIENT_BACKOFF_MAX_INTERVAL":           nil,
	"XDS_CLIENT_BACKOFF_RANDOM_FACTOR":          nil,
	"XDS_CLIENT_BACKOFF_JITTER":                 aBool,
	"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES":          nil,
	// Accepted with no effect, as in envoyproxy/ratelimit (see readXDS).
	"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL": nil,

	"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED": aBool,
	"RUNTIME_IGNOREDOTFILES":                  aBool,
	"RUNTIME_WATCH_ROOT":                      aBool,
	"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": aBool,
	"EXPIRATION_JITTER_MAX_SECONDS":           nil,
	"LOCAL_CACHE_SIZE_IN_BYTES":               nil,
	"REDIS_PIPELINE_WINDOW":                   nil,
	"REDIS_PIPELINE_LIMIT":                    nil,
	"REDIS_CLUSTER_PIPELINE_PARALLELISM":      nil,
	"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION":    aBool,
	"REDIS_POOL_ON_EMPTY_BEHAVIOR":            nil,
	"REDIS_STARTUP_INITIAL_INTERVAL":          nil,
	"REDIS_STARTUP_MAX_INTERVAL":              nil,
	"REDIS_STARTUP_MAX_ELAPSED_TIME":          nil,

	// What Charon does not do: accepted off, refused on.
	"USE_DOG_STATSD":                           onlyOff("DogStatsD tags are not supported: set it to false (or unset it); USE_STATSD sends plain statsd"),
	"EXTRA_TAGS":                               notSet("statsd tags are not supported, the stats carry their names only: unset it"),
	"USE_DOG_STATSD_MOGRIFIERS":                notSet("DogStatsD mogrifiers are not supported: unset it"),
	"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS": onlyOff(responseTimeSeconds),
	"REDIS_PERSECOND":                          onlyOff("a second Redis for per-second limits is not supported: set it to false (or unset it); every limit uses REDIS_URL"),
	"REDIS_SENTINEL_AUTH":                      notSet("put the Sentinels' password in the URL instead: CHARON_REDIS_URL=redis-sentinel://host:port/master?sentinel_password=..."),
	"CACHE_KEY_PREFIX":                         notSet("Charon's Redis keys have their own layout under charon:, whatever the prefix: unset it"),

	// No effect with the settings above off, in envoyproxy/ratelimit too.
	"REDIS_PERSECOND_SOCKET_TYPE": nil, "REDIS_PERSECOND_TYPE": nil, "REDIS_PERSECOND_URL": nil, "REDIS_PERSECOND_POOL_SIZE": nil,
	"REDIS_PERSECOND_AUTH": nil, "REDIS_PERSECOND_TLS": nil, "REDIS_PERSECOND_SENTINEL_AUTH": nil,
	"REDIS_PERSECOND_PIPELINE_WINDOW": nil, "REDIS_PERSECOND_PIPELINE_LIMIT": nil,
	"REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM": nil, "REDIS_PERSECOND_TIMEOUT": nil, "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR": nil,
	"MEMCACHE_HOST_PORT": nil, "MEMCACHE_MAX_IDLE_CONNS": nil, "MEMCACHE_SRV": nil, "MEMCACHE_SRV_REFRESH": nil,
	"MEMCACHE_TLS": nil, "MEMCACHE_TLS_CLIENT_CERT": nil, "MEMCACHE_TLS_CLIENT_KEY": nil, "MEMCACHE_TLS_CACERT": nil,
	"MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION": nil,
}

func onlyValue(v, want, why string) error {
	if strings.EqualFold(v, want) {
		return nil
	}
	return fmt.Errorf("%s", why)
}

// Names returns the names of every variable of envoyproxy/ratelimit that
// Charon reads or refuses, sorted.
func Names() []string {
	names := make([]string, 0, len(variables))
	for n := range variables {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// check refuses the values Charon cannot honour, in name order.
func check(getenv func(string) string) error {
	for _, n := range Names() {
		if n == "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS" && getenv("PROMETHEUS_MAPPER_YAML") != "" {
			// It changes only envoyproxy/ratelimit's built-in mapping: with
			// a mapping file of one's own it has no effect, there too.
			continue
		}
		if f := variables[n]; f != nil {
			if v := getenv(n); v != "" {
				if err := f(v); err != nil {
					return fmt.Errorf("%s=%q: %v", n, v, err)
				}
			}
		}
	}
	return nil
}
