// Package lyftenv reads envoyproxy/ratelimit's environment variables, so
// that its deployments run Charon by changing the image: each variable
// becomes the value of the `charon serve` flag with its meaning (applied
// below CHARON_* variables and command-line flags), or an error naming it.
//
//	RUNTIME_ROOT, RUNTIME_SUBDIRECTORY, RUNTIME_APPDIRECTORY   --config (with CONFIG_TYPE=FILE, its default)
//	CONFIG_TYPE=GRPC_XDS_SOTW with CONFIG_GRPC_XDS_*, XDS_*     --config-xds, --config-xds-* (readXDS)
//	GRPC_PORT, PORT, DEBUG_PORT                                --grpc-addr, --http-addr, --debug-addr (127.0.0.1)
//	MERGE_DOMAIN_CONFIG                                        --merge-domains
//	LOG_LEVEL, LOG_FORMAT                                      Settings.LogLevel, LogFormat
//	BACKEND_TYPE=redis                                         --store redis (other values are refused)
//	REDIS_URL with REDIS_TYPE, REDIS_SOCKET_TYPE, REDIS_TLS    --store redis, --redis-url
//	REDIS_AUTH                                                 Settings.RedisUsername, RedisPassword (never a flag)
//	REDIS_POOL_SIZE                                            --redis-pool-size
//	GRPC_SERVER_USE_TLS with GRPC_SERVER_TLS_CERT, _KEY        --grpc-tls-cert, --grpc-tls-key
//	GRPC_CLIENT_TLS_CACERT, GRPC_CLIENT_TLS_SAN                --grpc-tls-client-ca, --grpc-tls-client-san
//	REDIS_TLS_CACERT, REDIS_TLS_CLIENT_CERT, _KEY              --redis-tls-ca, --redis-tls-cert, --redis-tls-key (with REDIS_TLS=true)
//	REDIS_TLS_SKIP_HOSTNAME_VERIFICATION                       --redis-tls-skip-hostname (with REDIS_TLS=true)
//	USE_STATSD, STATSD_HOST, STATSD_PORT, STATS_FLUSH_INTERVAL --statsd-addr, --statsd-flush-interval (not with DISABLE_STATS=true)
//	STATSD_PROTOCOL (github.com/lyft/gostats', default tcp)    --statsd-protocol, with statsd on
//	USE_PROMETHEUS, PROMETHEUS_ADDR, PROMETHEUS_PATH           --metrics-addr, --metrics-path (not with DISABLE_STATS=true)
//	PROMETHEUS_MAPPER_YAML                                     --metrics-mapping (with USE_PROMETHEUS=true)
//	STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=false              --overdraft (true, Charon's default, maps to nothing)
package lyftenv

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
)

// Settings are what the environment says.
type Settings struct {
	// Flags are flag values to apply, in order.
	Flags []Flag
	// RedisUsername and RedisPassword come from REDIS_AUTH.
	RedisUsername, RedisPassword string
	// LogLevel and LogFormat come from LOG_LEVEL and LOG_FORMAT.
	LogLevel, LogFormat string
}

// Flag is one flag value and the variable it comes from: From names
// every variable that made it, joined by ", " ("RUNTIME_ROOT,
// RUNTIME_SUBDIRECTORY"), or CONFIG_TYPE=GRPC_XDS_SOTW for the xDS
// server's default address.
type Flag struct {
	Name, Value, From string
}

func (s *Settings) set(name, value, from string) {
	s.Flags = append(s.Flags, Flag{Name: name, Value: value, From: from})
}

// Read reads the variables through getenv; an error names the variable at
// fault and why.
func Read(getenv func(string) string) (Settings, error) {
	var s Settings
	err := read(&s, getenv)
	return s, err
}

// envoyproxy/ratelimit's defaults of RUNTIME_ROOT and RUNTIME_APPDIRECTORY.
const (
	lyftRuntimeRoot = "/srv/runtime_data/current"
	lyftAppDir      = "config"
)

func read(s *Settings, getenv func(string) string) error {
	if err := readTLS(s, getenv); err != nil {
		return err
	}
	xds := strings.EqualFold(getenv("CONFIG_TYPE"), "GRPC_XDS_SOTW")
	root, sub, app := getenv("RUNTIME_ROOT"), getenv("RUNTIME_SUBDIRECTORY"), getenv("RUNTIME_APPDIRECTORY")
	if !xds && (root != "" || sub != "" || app != "") {
		// From names every variable set, for messages to name what to
		// unset.
		var from []string
		for _, v := range []struct{ name, value string }{{"RUNTIME_ROOT", root}, {"RUNTIME_SUBDIRECTORY", sub}, {"RUNTIME_APPDIRECTORY", app}} {
			if v.value != "" {
				from = append(from, v.name)
			}
		}
		if root == "" {
			root = lyftRuntimeRoot
		}
		if app == "" {
			app = lyftAppDir
		}
		s.set("config", filepath.Join(root, sub, app), strings.Join(from, ", "))
	}
	if err := check(getenv); err != nil {
		return err
	}
	if xds {
		if err := readXDS(s, getenv); err != nil {
			return err
		}
	}
	// Addresses: HOST:PORT as envoyproxy/ratelimit listens (its hosts
	// default to 0.0.0.0, its ports to 8080, 8081 and 6070), except that
	// the debug port stays on loopback unless DEBUG_HOST says otherwise.
	addrs := []struct {
		host, port, defHost, defPort, flag string
	}{
		{"GRPC_HOST", "GRPC_PORT", "", "8081", "grpc-addr"},
		{"HOST", "PORT", "", "8080", "http-addr"},
		{"DEBUG_HOST", "DEBUG_PORT", "127.0.0.1", "6070", "debug-addr"},
	}
	for _, a := range addrs {
		host, port := getenv(a.host), getenv(a.port)
		if host == "" && port == "" {
			continue
		}
		from := a.port
		if port == "" {
			port, from = a.defPort, a.host
		} else if n, err := strconv.ParseUint(port, 10, 16); err != nil {
			return fmt.Errorf("%s=%q: not a port number", a.port, port)
		} else {
			port = strconv.FormatUint(n, 10)
		}
		if host == "" {
			host = a.defHost
		} else if host == "0.0.0.0" {
			host = ""
		}
		s.set(a.flag, net.JoinHostPort(host, port), from)
	}
	for _, m := range []struct{ env, flag string }{
		{"SHADOW_MODE", "shadow-mode"},
		{"QUOTA_MODE", "quota-mode"},
		{"RESPONSE_DYNAMIC_METADATA", "dynamic-metadata"},
		{"TRACING_ENABLED", "tracing"},
		{"TRACING_SERVICE_NAME", "tracing-service-name"},
		{"TRACING_SERVICE_NAMESPACE", "tracing-service-namespace"},
		{"TRACING_SERVICE_INSTANCE_ID", "tracing-service-instance-id"},
		{"TRACING_EXPORTER_PROTOCOL", "tracing-protocol"},
		{"TRACING_SAMPLING_RATE", "tracing-sampling-rate"},
		{"LIMIT_RESPONSE_HEADERS_ENABLED", "response-headers"},
		{"LIMIT_LIMIT_HEADER", "limit-header"},
		{"LIMIT_REMAINING_HEADER", "remaining-header"},
		{"LIMIT_RESET_HEADER", "reset-header"},
		{"NEAR_LIMIT_RATIO", "near-limit-ratio"},
		{"GRPC_MAX_CONNECTION_AGE", "grpc-max-connection-age"},
		{"GRPC_MAX_CONNECTION_AGE_GRACE", "grpc-max-connection-age-grace"},
		{"REDIS_TIMEOUT", "redis-timeout"},
	} {
		if v := getenv(m.env); v != "" {
			s.set(m.flag, v, m.env)
		}
	}
	// envoyproxy/ratelimit counts a refused request's hits unless this is
	// true; Charon counts for admission by default. Set to false, it
	// selects post-paid counting for every limit, as there.
	if on, set, err := boolean(getenv, "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT"); err != nil {
		return err
	} else if set && !on {
		s.set("overdraft", "true", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT")
	}
	if err := readStats(s, getenv); err != nil {
		return err
	}
	if v := getenv("LOG_LEVEL"); v != "" {
		s.LogLevel = v
	}
	if v := getenv("LOG_FORMAT"); v != "" {
		s.LogFormat = v
	}
	if v := getenv("MERGE_DOMAIN_CONFIG"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("MERGE_DOMAIN_CONFIG=%q: not a boolean", v)
		}
		s.set("merge-domains", strconv.FormatBool(b), "MERGE_DOMAIN_CONFIG")
	}
	return readRedis(s, getenv)
}

// readXDS maps the variables of CONFIG_TYPE=GRPC_XDS_SOTW (they have no
// effect otherwise, there too), with envoyproxy/ratelimit's defaults where
// they differ from Charon's:
//
//	CONFIG_GRPC_XDS_SERVER_URL (localhost:18000)         --config-xds
//	CONFIG_GRPC_XDS_NODE_ID, _NODE_METADATA              --config-xds-node-id, --config-xds-node-metadata
//	CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS            --config-xds-headers
//	CONFIG_GRPC_XDS_SERVER_USE_TLS=true with             --config-xds-tls
//	  CONFIG_GRPC_XDS_CLIENT_TLS_CERT, _KEY                --config-xds-tls-cert, --config-xds-tls-key
//	  CONFIG_GRPC_XDS_SERVER_TLS_CACERT, _SAN              --config-xds-tls-ca, --config-xds-tls-server-name
//	XDS_CLIENT_BACKOFF_INITIAL_INTERVAL (10s), _MAX_INTERVAL, _RANDOM_FACTOR (0.5), _JITTER
//	                                                     --config-xds-backoff-initial, -max, -factor, -jitter
//	XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES (0: gRPC's 4 MiB)   --config-xds-max-msg-size
//	FORCE_START_WITHOUT_INITIAL_CONFIG                   --config-xds-force-start
//
// CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL is accepted with no
// effect: envoyproxy/ratelimit gives it to a go-grpc-middleware retry
// interceptor that has no retries (that library's default), so it has
// none there either.
func readXDS(s *Settings, getenv func(string) string) error {
	if v := getenv("CONFIG_GRPC_XDS_SERVER_URL"); v != "" {
		s.set("config-xds", v, "CONFIG_GRPC_XDS_SERVER_URL")
	} else {
		s.set("config-xds", "localhost:18000", "CONFIG_TYPE=GRPC_XDS_SOTW")
	}
	for _, m := range []struct{ env, flag, def string }{
		{"CONFIG_GRPC_XDS_NODE_ID", "config-xds-node-id", ""},
		{"CONFIG_GRPC_XDS_NODE_METADATA", "config-xds-node-metadata", ""},
		{"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "config-xds-headers", ""},
		{"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "config-xds-backoff-initial", "10s"},
		{"XDS_CLIENT_BACKOFF_MAX_INTERVAL", "config-xds-backoff-max", ""},
		{"XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "config-xds-backoff-factor", "0.5"},
	} {
		if v := cmp.Or(getenv(m.env), m.def); v != "" {
			s.set(m.flag, v, m.env)
		}
	}
	for _, m := range []struct{ env, flag string }{
		{"XDS_CLIENT_BACKOFF_JITTER", "config-xds-backoff-jitter"},
		{"FORCE_START_WITHOUT_INITIAL_CONFIG", "config-xds-force-start"},
	} {
		if on, set, err := boolean(getenv, m.env); err != nil {
			return err
		} else if set {
			s.set(m.flag, strconv.FormatBool(on), m.env)
		}
	}
	if v := getenv("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return fmt.Errorf("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES=%q: not a size in bytes", v)
		}
		if n > 0 {
			s.set("config-xds-max-msg-size", v, "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES")
		}
	}
	on, _, err := boolean(getenv, "CONFIG_GRPC_XDS_SERVER_USE_TLS")
	if err != nil || !on {
		return err
	}
	s.set("config-xds-tls", "true", "CONFIG_GRPC_XDS_SERVER_USE_TLS")
	for _, m := range []struct{ env, flag string }{
		{"CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "config-xds-tls-cert"},
		{"CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "config-xds-tls-key"},
		{"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "config-xds-tls-ca"},
		{"CONFIG_GRPC_XDS_SERVER_TLS_SAN", "config-xds-tls-server-name"},
	} {
		if v := getenv(m.env); v != "" {
			s.set(m.flag, v, m.env)
		}
	}
	return nil
}

// readRedis maps envoyproxy/ratelimit's Redis variables:
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
// readTLS maps the TLS files (with REDIS_TLS=true only); their other Redis
// variables (per-second Redis, pipelining) are not mapped.
func readRedis(s *Settings, getenv func(string) string) error {
	switch v := getenv("BACKEND_TYPE"); strings.ToLower(v) {
	case "":
	case "redis":
		s.set("store", "redis", "BACKEND_TYPE")
	default:
		return fmt.Errorf("BACKEND_TYPE=%q: only redis is supported (or leave it unset for the in-memory store)", v)
	}
	if v := getenv("REDIS_POOL_SIZE"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return fmt.Errorf("REDIS_POOL_SIZE=%q: not a connection count", v)
		}
		s.set("redis-pool-size", strconv.Itoa(n), "REDIS_POOL_SIZE")
	}
	if v := getenv("REDIS_AUTH"); v != "" {
		if user, pass, ok := strings.Cut(v, ":"); ok {
			s.RedisUsername, s.RedisPassword = user, pass
		} else {
			s.RedisPassword = v
		}
	}
	raw := getenv("REDIS_URL")
	if raw == "" {
		return nil
	}
	tlsOn, _, err := boolean(getenv, "REDIS_TLS")
	if err != nil {
		return err
	}
	tls := ""
	if tlsOn {
		tls = "s"
	}
	hosts := func(list []string) (string, error) {
		for _, h := range list {
			if strings.TrimSpace(h) == "" || strings.Contains(h, "/") {
				return "", errors.New("REDIS_URL: want host:port entries, not a URL (the value is not shown: it may hold a password)")
			}
		}
		return strings.Join(list, ","), nil
	}
	switch t := strings.ToLower(getenv("REDIS_TYPE")); t {
	case "", "single":
		switch sock := strings.ToLower(getenv("REDIS_SOCKET_TYPE")); {
		case sock == "unix" || (sock == "" && strings.HasPrefix(raw, "/")):
			if tlsOn {
				return fmt.Errorf("REDIS_TLS over a unix socket is not supported")
			}
			s.set("redis-url", "unix://"+raw, "REDIS_URL")
		case sock == "" || sock == "tcp":
			h, err := hosts([]string{raw})
			if err != nil {
				return err
			}
			s.set("redis-url", "redis"+tls+"://"+h, "REDIS_URL")
		default:
			return fmt.Errorf("REDIS_SOCKET_TYPE=%q: want tcp or unix", sock)
		}
	case "sentinel":
		parts := strings.Split(raw, ",")
		if len(parts) < 2 || parts[0] == "" {
			return errors.New("REDIS_URL: want master,host:port[,host:port...] with REDIS_TYPE=SENTINEL")
		}
		h, err := hosts(parts[1:])
		if err != nil {
			return err
		}
		s.set("redis-url", "redis"+tls+"-sentinel://"+h+"/"+url.PathEscape(parts[0]), "REDIS_URL")
	case "cluster":
		h, err := hosts(strings.Split(raw, ","))
		if err != nil {
			return err
		}
		s.set("redis-url", "redis"+tls+"-cluster://"+h, "REDIS_URL")
	default:
		return fmt.Errorf("REDIS_TYPE=%q: want SINGLE, SENTINEL or CLUSTER", t)
	}
	s.set("store", "redis", "REDIS_URL")
	return nil
}

// boolean reads a boolean variable: set reports whether it has a value at
// all, and an error names it.
func boolean(getenv func(string) string, name string) (on, set bool, err error) {
	v := getenv(name)
	if v == "" {
		return false, false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, true, fmt.Errorf("%s=%q: not a boolean", name, v)
	}
	return b, true, nil
}

// readStats maps the stats sinks as envoyproxy/ratelimit chooses them:
// DISABLE_STATS=true turns every sink off; USE_STATSD defaults to true
// there, so STATSD_HOST, STATSD_PORT or STATSD_PROTOCOL alone sends statsd
// stats (to localhost:8125 for what is not set). With none of the four set,
// Charon sends no statsd, where envoyproxy/ratelimit would send to
// localhost:8125.
//
// Its statsd sink is github.com/lyft/gostats' NewTCPStatsdSink, which takes
// the host and port from envoyproxy/ratelimit but its transport from
// gostats' own STATSD_PROTOCOL, tcp unless set; net.Dial takes other
// networks too (tcp4, udp6, ...), which are refused here.
func readStats(s *Settings, getenv func(string) string) error {
	disabled, _, err := boolean(getenv, "DISABLE_STATS")
	if err != nil {
		return err
	}
	if disabled {
		return nil
	}
	useStatsd, statsdSet, err := boolean(getenv, "USE_STATSD")
	if err != nil {
		return err
	}
	host, port, proto := getenv("STATSD_HOST"), getenv("STATSD_PORT"), getenv("STATSD_PROTOCOL")
	from := "USE_STATSD"
	if !statsdSet {
		useStatsd = host != "" || port != "" || proto != ""
		switch {
		case host != "":
			from = "STATSD_HOST"
		case port != "":
			from = "STATSD_PORT"
		default:
			from = "STATSD_PROTOCOL"
		}
	}
	if useStatsd {
		if port == "" {
			port = "8125"
		} else if n, err := strconv.ParseUint(port, 10, 16); err != nil {
			return fmt.Errorf("STATSD_PORT=%q: not a port number", port)
		} else {
			port = strconv.FormatUint(n, 10)
		}
		switch proto {
		case "":
			proto = "tcp"
		case "tcp", "udp":
		default:
			return fmt.Errorf("STATSD_PROTOCOL=%q: want tcp (its default) or udp", proto)
		}
		s.set("statsd-addr", net.JoinHostPort(cmp.Or(host, "localhost"), port), from)
		s.set("statsd-protocol", proto, "STATSD_PROTOCOL")
		if v := getenv("STATS_FLUSH_INTERVAL"); v != "" {
			s.set("statsd-flush-interval", v, "STATS_FLUSH_INTERVAL")
		}
	}
	if on, _, err := boolean(getenv, "USE_PROMETHEUS"); err != nil {
		return err
	} else if on {
		s.set("metrics-addr", cmp.Or(getenv("PROMETHEUS_ADDR"), ":9090"), "USE_PROMETHEUS")
		s.set("metrics-path", cmp.Or(getenv("PROMETHEUS_PATH"), "/metrics"), "PROMETHEUS_PATH")
		if v := getenv("PROMETHEUS_MAPPER_YAML"); v != "" {
			s.set("metrics-mapping", v, "PROMETHEUS_MAPPER_YAML")
		}
	}
	return nil
}

// readTLS maps the TLS variables of the gRPC server and of Redis.
func readTLS(s *Settings, getenv func(string) string) error {
	on, _, err := boolean(getenv, "GRPC_SERVER_USE_TLS")
	if err != nil {
		return err
	}
	cert, key := getenv("GRPC_SERVER_TLS_CERT"), getenv("GRPC_SERVER_TLS_KEY")
	if on {
		if cert == "" || key == "" {
			return fmt.Errorf("GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY")
		}
		s.set("grpc-tls-cert", cert, "GRPC_SERVER_TLS_CERT")
		s.set("grpc-tls-key", key, "GRPC_SERVER_TLS_KEY")
		if v := getenv("GRPC_CLIENT_TLS_CACERT"); v != "" {
			s.set("grpc-tls-client-ca", v, "GRPC_CLIENT_TLS_CACERT")
		}
		if v := getenv("GRPC_CLIENT_TLS_SAN"); v != "" {
			s.set("grpc-tls-client-san", v, "GRPC_CLIENT_TLS_SAN")
		}
	}
	// envoyproxy/ratelimit reads the Redis TLS files only with
	// REDIS_TLS=true and otherwise dials plain TCP; any --redis-tls-* flag
	// turns TLS on, so without REDIS_TLS=true they map to nothing.
	// (REDIS_PERSECOND_TLS=true reads them there too, for the per-second
	// Redis only, which is refused.)
	redisTLS, _, err := boolean(getenv, "REDIS_TLS")
	if err != nil {
		return err
	}
	skip, _, err := boolean(getenv, "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")
	if err != nil || !redisTLS {
		return err
	}
	for _, m := range []struct{ env, flag string }{
		{"REDIS_TLS_CACERT", "redis-tls-ca"},
		{"REDIS_TLS_CLIENT_CERT", "redis-tls-cert"},
		{"REDIS_TLS_CLIENT_KEY", "redis-tls-key"},
	} {
		if v := getenv(m.env); v != "" {
			s.set(m.flag, v, m.env)
		}
	}
	if skip {
		s.set("redis-tls-skip-hostname", "true", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")
	}
	return nil
}
