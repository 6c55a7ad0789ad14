package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/internal/authz"
	"github.com/charonlimit/charon/internal/copystore"
	"github.com/charonlimit/charon/internal/copystore/memcopy"
	"github.com/charonlimit/charon/internal/decisionlog"
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/internal/gctune"
	"github.com/charonlimit/charon/internal/lyftenv"
	"github.com/charonlimit/charon/internal/redisbackend"
	"github.com/charonlimit/charon/internal/statsd"
	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/internal/store/redisstore"
	"github.com/charonlimit/charon/internal/store/resilient"
	"github.com/charonlimit/charon/internal/tlsconfig"
	"github.com/charonlimit/charon/internal/tracing"
	"github.com/charonlimit/charon/server"
)

// serveConfig is everything `charon serve` is told, after defaults,
// envoyproxy/ratelimit's environment, CHARON_* variables and flags, in rising
// precedence.
type serveConfig struct {
	ConfigDir string
	GRPCAddr  string
	HTTPAddr  string
	DebugAddr string
	// MetricsAddr and MetricsPath serve the metrics alone; LyftMetrics adds
	// envoyproxy/ratelimit's names.
	MetricsAddr string
	MetricsPath string
	LyftMetrics bool
	// StatsdAddr, when set, sends envoyproxy/ratelimit's statsd stats
	// there, flushed every StatsdFlush.
	StatsdAddr  string
	StatsdFlush time.Duration
	// Tracing sends OpenTelemetry traces of gRPC and Redis calls over OTLP
	// (endpoint from the OTEL_EXPORTER_OTLP_* variables).
	Tracing          bool
	TracingService   string
	TracingNamespace string
	TracingInstance  string
	TracingProtocol  string
	TracingSampling  float64
	Store            string
	// Redis are the Redis flags; the password comes from a file,
	// CHARON_REDIS_PASSWORD or REDIS_AUTH (never a flag, which ps would
	// show).
	Redis           redisbackend.Flags
	MaxDescriptors  int
	MaxKeys         int
	ResponseHeaders bool
	HeaderNames     [3]string
	ShadowMode      bool
	QuotaMode       bool
	DynamicMetadata bool
	NearLimitRatio  float64
	MaxConnAge      time.Duration
	MaxConnAgeGrace time.Duration
	MergeDomains    bool
	FixedWindow     bool
	ShutdownTimeout time.Duration
	ShutdownDelay   time.Duration
	HTTPReadTimeout time.Duration
	MaxStreams      uint
	HeapFloorMiB    int
	LogLevel        string
	LogFormat       string
	// GRPCTLS is the gRPC port's TLS (and the HTTP port's with HTTPTLS).
	GRPCTLS tlsconfig.ServerFlags
	HTTPTLS bool
	// Authz is the authorization table file (with mutual TLS).
	Authz string
	// DebugTokenFile holds the debug port's bearer token; DebugTLS
	// serves the debug port with the gRPC port's TLS; Pprof serves
	// /debug/pprof/ there.
	DebugTokenFile string
	DebugTLS       bool
	Pprof          bool
	// DebugReset serves POST /reset on the debug port.
	DebugReset bool
	// DecisionLog is the decision log's target; DecisionSample and
	// DecisionRate its sample and rate bound.
	DecisionLog    string
	DecisionSample float64
	DecisionRate   int
}

func defaultServeConfig() serveConfig {
	return serveConfig{
		GRPCAddr:        ":8081",
		HTTPAddr:        ":8080",
		DebugAddr:       "127.0.0.1:6070",
		Store:           "memory",
		MetricsPath:     "/metrics",
		LyftMetrics:     true,
		StatsdFlush:     time.Second,
		TracingService:  "charon",
		TracingProtocol: "http",
		TracingSampling: 1,
		MaxDescriptors:  64,
		MaxKeys:         memstore.DefaultMaxKeys,
		Redis:           redisbackend.Flags{Options: redisbackend.Options{Timeout: resilient.DefaultTimeout}},
		ShutdownTimeout: 10 * time.Second,
		ShutdownDelay:   5 * time.Second,
		HTTPReadTimeout: server.DefaultHTTPReadTimeout,
		MaxStreams:      server.DefaultMaxConcurrentStreams,
		NearLimitRatio:  0.8,
		HeaderNames:     [3]string{"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"},
		HeapFloorMiB:    defaultHeapFloorMiB,
		DecisionSample:  0.01,
		DecisionRate:    decisionlog.DefaultRate,
		LogLevel:        "info",
		LogFormat:       "json",
	}
}

// defaultHeapFloorMiB is the default of --heap-floor-mib: a server with a
// small live heap collects garbage once per 256 MiB allocated instead of
// once per few MiB (package gctune). Marking the states of tracked pairs is
// most of a collection's work: with three descriptors per request over
// 10,000 users, 256 MiB took the memory store from 0.57 to 0.72 of the no-op
// call's throughput (docs/performance.md).
const defaultHeapFloorMiB = 256

// serveFlags declares serve's flags on fs with c's values as defaults, so
// parsing overrides only what is given.
func serveFlags(fs *flag.FlagSet, c *serveConfig) {
	fs.StringVar(&c.ConfigDir, "config", c.ConfigDir, "configuration `directory` (watched; env CHARON_CONFIG)")
	fs.StringVar(&c.GRPCAddr, "grpc-addr", c.GRPCAddr, "gRPC listen `address` (env CHARON_GRPC_ADDR)")
	fs.StringVar(&c.HTTPAddr, "http-addr", c.HTTPAddr, "HTTP listen `address` for /healthcheck and /json (env CHARON_HTTP_ADDR)")
	fs.StringVar(&c.DebugAddr, "debug-addr", c.DebugAddr, "debug listen `address` for /metrics, /rlconfig, pprof (env CHARON_DEBUG_ADDR)")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", c.MetricsAddr, "also serve the metrics alone on this `address`, at --metrics-path (env CHARON_METRICS_ADDR)")
	fs.StringVar(&c.MetricsPath, "metrics-path", c.MetricsPath, "the `path` of --metrics-addr (env CHARON_METRICS_PATH)")
	fs.BoolVar(&c.LyftMetrics, "lyft-metrics", c.LyftMetrics, "also count under envoyproxy/ratelimit's Prometheus names (ratelimit_service_*) (env CHARON_LYFT_METRICS)")
	fs.StringVar(&c.StatsdAddr, "statsd-addr", c.StatsdAddr, "send envoyproxy/ratelimit's statsd stats (its names) over UDP to this `host:port` (env CHARON_STATSD_ADDR)")
	fs.DurationVar(&c.StatsdFlush, "statsd-flush-interval", c.StatsdFlush, "how often buffered statsd stats are sent at the latest (env CHARON_STATSD_FLUSH_INTERVAL)")
	fs.BoolVar(&c.Tracing, "tracing", c.Tracing, "send OpenTelemetry traces of gRPC and Redis calls over OTLP, to the endpoint of the OTEL_EXPORTER_OTLP_* variables (env CHARON_TRACING)")
	fs.StringVar(&c.TracingService, "tracing-service-name", c.TracingService, "the traces' service.name (env CHARON_TRACING_SERVICE_NAME)")
	fs.StringVar(&c.TracingNamespace, "tracing-service-namespace", c.TracingNamespace, "the traces' service.namespace (env CHARON_TRACING_SERVICE_NAMESPACE)")
	fs.StringVar(&c.TracingInstance, "tracing-service-instance-id", c.TracingInstance, "the traces' service.instance.id; empty: a random one (env CHARON_TRACING_SERVICE_INSTANCE_ID)")
	fs.StringVar(&c.TracingProtocol, "tracing-protocol", c.TracingProtocol, "OTLP transport: http or grpc (env CHARON_TRACING_PROTOCOL)")
	fs.Float64Var(&c.TracingSampling, "tracing-sampling-rate", c.TracingSampling, "share of new traces sampled, 0 to 1 (env CHARON_TRACING_SAMPLING_RATE)")
	fs.StringVar(&c.Store, "store", c.Store, "state store: memory or redis (env CHARON_STORE)")
	c.Redis.Bind(fs)
	fs.IntVar(&c.MaxDescriptors, "max-descriptors", c.MaxDescriptors, "most descriptors in one request (env CHARON_MAX_DESCRIPTORS)")
	fs.IntVar(&c.MaxKeys, "max-keys", c.MaxKeys, "most tracked (resource, domain) pairs in memory, least recently used evicted (env CHARON_MAX_KEYS)")
	fs.BoolVar(&c.ResponseHeaders, "response-headers", c.ResponseHeaders, "add RateLimit-Limit/-Remaining/-Reset response headers (env CHARON_RESPONSE_HEADERS)")
	fs.StringVar(&c.HeaderNames[0], "limit-header", c.HeaderNames[0], "name of the limit header of --response-headers (env CHARON_LIMIT_HEADER)")
	fs.StringVar(&c.HeaderNames[1], "remaining-header", c.HeaderNames[1], "name of the remaining header of --response-headers (env CHARON_REMAINING_HEADER)")
	fs.StringVar(&c.HeaderNames[2], "reset-header", c.HeaderNames[2], "name of the reset header of --response-headers (env CHARON_RESET_HEADER)")
	fs.BoolVar(&c.ShadowMode, "shadow-mode", c.ShadowMode, "answer OK where the answer would be OVER_LIMIT (statuses keep their codes), counted in charon_global_shadow_mode_total (env CHARON_SHADOW_MODE)")
	fs.BoolVar(&c.QuotaMode, "quota-mode", c.QuotaMode, "every limit in quota mode: a descriptor over its limit is OVER_LIMIT, the request only when all its descriptors are (env CHARON_QUOTA_MODE)")
	fs.BoolVar(&c.DynamicMetadata, "dynamic-metadata", c.DynamicMetadata, "add envoyproxy/ratelimit's dynamic_metadata to responses: domain, descriptors, hits and the metadata of the descriptors that passed (env CHARON_DYNAMIC_METADATA)")
	fs.Float64Var(&c.NearLimitRatio, "near-limit-ratio", c.NearLimitRatio, "share of a limit from which granted hits count as near_limit (env CHARON_NEAR_LIMIT_RATIO)")
	fs.DurationVar(&c.MaxConnAge, "grpc-max-connection-age", c.MaxConnAge, "close gRPC connections after this age, so clients reconnect (and spread over new replicas); 0: never (env CHARON_GRPC_MAX_CONNECTION_AGE)")
	fs.DurationVar(&c.MaxConnAgeGrace, "grpc-max-connection-age-grace", c.MaxConnAgeGrace, "time the RPCs of a connection closed for its age get to finish (env CHARON_GRPC_MAX_CONNECTION_AGE_GRACE)")
	fs.BoolVar(&c.MergeDomains, "merge-domains", c.MergeDomains, "merge files that share a domain instead of refusing them (env CHARON_MERGE_DOMAINS)")
	fs.BoolVar(&c.FixedWindow, "fixed-window", c.FixedWindow, "rate_limit without an algorithm uses envoyproxy/ratelimit's calendar-aligned fixed window instead of the exact sliding window (env CHARON_FIXED_WINDOW)")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", c.ShutdownTimeout, "time in-flight requests get after the drain (env CHARON_SHUTDOWN_TIMEOUT)")
	fs.DurationVar(&c.ShutdownDelay, "shutdown-delay", c.ShutdownDelay, "on SIGTERM, answer health NOT_SERVING but keep serving this long before stopping, so load balancers stop sending; SIGINT or a second signal skips it (env CHARON_SHUTDOWN_DELAY)")
	fs.DurationVar(&c.HTTPReadTimeout, "http-read-timeout", c.HTTPReadTimeout, "time a client has to send a request's header and body on the HTTP and debug ports, and to finish a gRPC connection's handshake (env CHARON_HTTP_READ_TIMEOUT)")
	fs.UintVar(&c.MaxStreams, "max-concurrent-streams", c.MaxStreams, "most concurrent RPCs and streams on one gRPC or HTTP/2 connection (env CHARON_MAX_CONCURRENT_STREAMS)")
	c.GRPCTLS.Bind(fs, "grpc-tls-")
	fs.BoolVar(&c.HTTPTLS, "http-tls", c.HTTPTLS, "serve the HTTP port over TLS too, with the gRPC port's certificate and client CA")
	fs.StringVar(&c.Authz, "authz", c.Authz, "authorization table `file`: which client certificate identities may call which methods; needs --grpc-tls-client-ca (env CHARON_AUTHZ)")
	fs.StringVar(&c.DebugTokenFile, "debug-token-file", c.DebugTokenFile, "require this `file`'s bearer token on every debug port request (env CHARON_DEBUG_TOKEN_FILE)")
	fs.BoolVar(&c.DebugTLS, "debug-tls", c.DebugTLS, "serve the debug port over TLS too, with the gRPC port's certificate and client CA (env CHARON_DEBUG_TLS)")
	fs.BoolVar(&c.Pprof, "pprof", c.Pprof, "serve Go profiles at /debug/pprof/ on the debug port (env CHARON_PPROF)")
	fs.StringVar(&c.DecisionLog, "decision-log", c.DecisionLog, "write decisions as JSON lines to this `target`: a file, - (stdout) or unix:PATH (a socket) (env CHARON_DECISION_LOG)")
	fs.Float64Var(&c.DecisionSample, "decision-log-sample", c.DecisionSample, "share of ordinary grants logged; rejections and bursts are always logged (env CHARON_DECISION_LOG_SAMPLE)")
	fs.IntVar(&c.DecisionRate, "decision-log-rate", c.DecisionRate, "most decision log lines per second, the rest dropped and counted; -1: no bound (env CHARON_DECISION_LOG_RATE)")
	fs.BoolVar(&c.DebugReset, "debug-reset", c.DebugReset, "serve POST /reset on the debug port, which forgets pairs' state; needs --debug-token-file or --debug-tls with a client CA (env CHARON_DEBUG_RESET)")
	fs.IntVar(&c.HeapFloorMiB, "heap-floor-mib", c.HeapFloorMiB, "the garbage collector's heap goal is at least this many MiB while the live heap is small; 0: Go's default (env CHARON_HEAP_FLOOR_MIB)")
}

// applyCharonEnv applies CHARON_<FLAG> variables by setting the flags
// themselves, so they are parsed exactly like the flags.
func applyCharonEnv(fs *flag.FlagSet, getenv func(string) string) error {
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		name := "CHARON_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v := getenv(name); v != "" && err == nil {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%w: %s=%q: %v", errUsage, name, v, e)
			}
		}
	})
	return err
}

// parseServe resolves serve's configuration from args and the environment.
func parseServe(args []string, getenv func(string) string, stderr io.Writer) (serveConfig, error) {
	c := defaultServeConfig()
	lyft, err := lyftenv.Read(getenv)
	if err != nil {
		return c, fmt.Errorf("%w: %v", errUsage, err)
	}
	c.Redis.Username, c.Redis.Password = lyft.RedisUsername, lyft.RedisPassword
	if p := getenv("CHARON_REDIS_PASSWORD"); p != "" {
		c.Redis.Password = p
	}
	if lyft.LogLevel != "" {
		c.LogLevel = lyft.LogLevel
	}
	if lyft.LogFormat != "" {
		c.LogFormat = lyft.LogFormat
	}
	fs := flag.NewFlagSet("charon serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	serveFlags(fs, &c)
	for _, f := range lyft.Flags {
		if err := fs.Set(f.Name, f.Value); err != nil {
			return c, fmt.Errorf("%w: %s: %v", errUsage, f.From, err)
		}
	}
	if err := applyCharonEnv(fs, getenv); err != nil {
		return c, err
	}
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return c, err
		}
		return c, fmt.Errorf("%w: %v", errUsage, err)
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	switch c.Store {
	case "memory":
	case "redis":
		if _, err := c.Redis.Resolve(); err != nil {
			return c, fmt.Errorf("%w: %v", errUsage, err)
		}
	default:
		return c, fmt.Errorf("%w: --store %q: want memory or redis", errUsage, c.Store)
	}
	if c.MaxDescriptors < 1 {
		return c, fmt.Errorf("%w: --max-descriptors must be at least 1", errUsage)
	}
	if c.MaxKeys < 1 {
		return c, fmt.Errorf("%w: --max-keys must be at least 1", errUsage)
	}
	if c.ShutdownTimeout <= 0 {
		return c, fmt.Errorf("%w: --shutdown-timeout must be positive", errUsage)
	}
	if c.ShutdownDelay < 0 {
		return c, fmt.Errorf("%w: --shutdown-delay must not be negative", errUsage)
	}
	if c.HTTPReadTimeout <= 0 {
		return c, fmt.Errorf("%w: --http-read-timeout must be positive", errUsage)
	}
	if c.MaxStreams < 1 || c.MaxStreams > 1<<31-1 {
		return c, fmt.Errorf("%w: --max-concurrent-streams %d: want 1 to 2147483647", errUsage, c.MaxStreams)
	}
	if !(c.NearLimitRatio > 0 && c.NearLimitRatio <= 1) {
		return c, fmt.Errorf("%w: --near-limit-ratio %v: want more than 0, at most 1", errUsage, c.NearLimitRatio)
	}
	if c.MaxConnAge < 0 || c.MaxConnAgeGrace < 0 {
		return c, fmt.Errorf("%w: --grpc-max-connection-age and its grace must not be negative", errUsage)
	}
	for i, n := range c.HeaderNames {
		if n == "" || strings.ContainsAny(n, " \t\r\n:") {
			return c, fmt.Errorf("%w: --%s %q: not a header name", errUsage, []string{"limit-header", "remaining-header", "reset-header"}[i], n)
		}
	}
	if c.TracingProtocol != "http" && c.TracingProtocol != "grpc" {
		return c, fmt.Errorf("%w: --tracing-protocol %q: want http or grpc", errUsage, c.TracingProtocol)
	}
	if !(c.TracingSampling >= 0 && c.TracingSampling <= 1) {
		return c, fmt.Errorf("%w: --tracing-sampling-rate %v: want 0 to 1", errUsage, c.TracingSampling)
	}
	if c.StatsdFlush <= 0 {
		return c, fmt.Errorf("%w: --statsd-flush-interval must be positive", errUsage)
	}
	if c.StatsdAddr != "" {
		if _, _, err := net.SplitHostPort(c.StatsdAddr); err != nil {
			return c, fmt.Errorf("%w: --statsd-addr %q: want host:port", errUsage, c.StatsdAddr)
		}
	}
	if !strings.HasPrefix(c.MetricsPath, "/") {
		return c, fmt.Errorf("%w: --metrics-path %q: want a path starting with /", errUsage, c.MetricsPath)
	}
	if c.HeapFloorMiB < 0 || c.HeapFloorMiB > 1<<20 {
		return c, fmt.Errorf("%w: --heap-floor-mib %d: want 0 to 1048576", errUsage, c.HeapFloorMiB)
	}
	if err := c.GRPCTLS.Check("grpc-tls-"); err != nil {
		return c, fmt.Errorf("%w: %v", errUsage, err)
	}
	if c.HTTPTLS && !c.GRPCTLS.On() {
		return c, fmt.Errorf("%w: --http-tls needs --grpc-tls-cert and --grpc-tls-key", errUsage)
	}
	if c.DebugTLS && !c.GRPCTLS.On() {
		return c, fmt.Errorf("%w: --debug-tls needs --grpc-tls-cert and --grpc-tls-key", errUsage)
	}
	if c.Authz != "" && c.GRPCTLS.ClientCA == "" {
		return c, fmt.Errorf("%w: --authz needs --grpc-tls-client-ca: identities come from client certificates", errUsage)
	}
	if _, err := parseLevel(c.LogLevel); err != nil {
		return c, err
	}
	if c.LogFormat != "json" && c.LogFormat != "text" {
		return c, fmt.Errorf("%w: LOG_FORMAT %q: want json or text", errUsage, c.LogFormat)
	}
	return c, nil
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return l, fmt.Errorf("%w: LOG_LEVEL %q: want debug, info, warn or error", errUsage, s)
	}
	return l, nil
}

func newLogger(level, format string, w io.Writer) *slog.Logger {
	l, _ := parseLevel(level)
	opts := &slog.HandlerOptions{Level: l}
	if format == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

func runServe(args []string, getenv func(string) string, stderr io.Writer) error {
	c, err := parseServe(args, getenv, stderr)
	if err != nil {
		return err
	}
	log := newLogger(c.LogLevel, c.LogFormat, stderr)
	defer gctune.Floor(uint64(c.HeapFloorMiB) << 20).Stop()

	local := memstore.Options{MaxKeys: c.MaxKeys, SweepInterval: 10 * time.Second}
	var (
		st      store.Store
		copies  copystore.Store
		metrics *server.Metrics
		backend *redisbackend.Backend
		held    func() float64
	)
	if c.Tracing {
		tp, err := tracing.New(context.Background(), tracing.Options{ServiceName: c.TracingService, ServiceNamespace: c.TracingNamespace,
			InstanceID: c.TracingInstance, Protocol: c.TracingProtocol, SamplingRate: c.TracingSampling})
		if err != nil {
			log.Error("cannot start", "err", "--tracing: "+err.Error())
			return errReported
		}
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := tp.Shutdown(ctx); err != nil {
				log.Warn("sending the last traces", "err", err.Error())
			}
		}()
	}
	tlsCfg, err := c.GRPCTLS.Config()
	if err != nil {
		log.Error("cannot start", "err", err.Error())
		return errReported
	}
	sec, err := loadSecurity(c, args, log)
	if err != nil {
		log.Error("cannot start", "err", err.Error())
		return errReported
	}
	if c.Store == "redis" {
		bo, err := c.Redis.Resolve()
		if err != nil {
			log.Error("cannot start", "err", err.Error())
			return errReported
		}
		bo.Local, bo.Logger, bo.Tracing = local, log, c.Tracing
		if backend, err = redisbackend.Open(bo); err != nil {
			log.Error("cannot start", "err", "redis store: "+err.Error())
			return errReported
		}
		defer backend.Close()
		log.Info("store", "kind", "redis", "failure_mode", bo.FailureMode.String(), "timeout", bo.Timeout)
		st, copies = backend.Store(), backend.Copies()
		metrics = server.NewMetrics(nil)
		backend.Register(metrics.Registry)
		held = func() float64 { return float64(backend.Copies().Stats().Live.Copies) }
	} else {
		mem := memstore.New(local)
		defer mem.Close()
		mc := memcopy.New(memcopy.Options{SweepInterval: time.Second})
		defer mc.Close()
		st, copies = mem, mc
		metrics = server.NewMetrics(func() float64 { return float64(mem.Evictions()) })
		metrics.Registry.MustRegister(mc.Collector())
		held = func() float64 { return float64(mc.Stats().Copies) }
	}
	if c.LyftMetrics {
		metrics.LyftNames()
	}
	if c.StatsdAddr != "" {
		sink, err := statsd.New(c.StatsdAddr, c.StatsdFlush)
		if err != nil {
			log.Error("cannot start", "err", "--statsd-addr: "+err.Error())
			return errReported
		}
		defer sink.Close()
		metrics.SendStats(sink)
	}
	eo := engine.Options{Store: st, MaxDescriptors: c.MaxDescriptors, Copies: copies, QuotaMode: c.QuotaMode,
		FixedWindowOverrides: c.FixedWindow}
	if backend != nil {
		eo.OnSetTree = backend.SetTree
	}
	eng := engine.New(eo)
	var decisions *decisionlog.Logger
	if c.DecisionLog != "" {
		if c.DecisionSample < 0 || c.DecisionSample > 1 {
			log.Error("cannot start", "err", "--decision-log-sample: must be in [0, 1]")
			return errReported
		}
		if decisions, err = decisionlog.Open(c.DecisionLog, decisionlog.Options{Sample: c.DecisionSample, Rate: c.DecisionRate}); err != nil {
			log.Error("cannot start", "err", "--decision-log: "+err.Error())
			return errReported
		}
		defer decisions.Close()
	}
	cfgOpts := config.Options{MergeDomains: c.MergeDomains, FixedWindowDefault: c.FixedWindow}
	opts := server.Options{
		GRPCAddr:              c.GRPCAddr,
		HTTPAddr:              c.HTTPAddr,
		DebugAddr:             c.DebugAddr,
		Engine:                eng,
		ConfigDir:             c.ConfigDir,
		Load:                  func(fsys fs.FS) (*config.Config, []config.Warning, error) { return config.Load(fsys, cfgOpts) },
		ResponseHeaders:       c.ResponseHeaders,
		ShutdownTimeout:       c.ShutdownTimeout,
		ShutdownDelay:         c.ShutdownDelay,
		HTTPReadTimeout:       c.HTTPReadTimeout,
		MaxConcurrentStreams:  uint32(c.MaxStreams),
		Logger:                log,
		Metrics:               metrics,
		Charon:                server.CharonOptions{Engine: eng, Holds: held},
		GRPCTLS:               tlsCfg,
		Authz:                 sec.authz,
		DebugToken:            sec.debugToken,
		Pprof:                 c.Pprof,
		DebugReset:            c.DebugReset,
		DecisionLog:           decisions,
		MetricsAddr:           c.MetricsAddr,
		MetricsPath:           c.MetricsPath,
		HeaderNames:           c.HeaderNames,
		ShadowMode:            c.ShadowMode,
		DynamicMetadata:       c.DynamicMetadata,
		NearLimitRatio:        c.NearLimitRatio,
		MaxConnectionAge:      c.MaxConnAge,
		MaxConnectionAgeGrace: c.MaxConnAgeGrace,
		Tracing:               c.Tracing,
	}
	if c.HTTPTLS {
		opts.HTTPTLS = tlsCfg
	}
	if c.DebugTLS {
		opts.DebugTLS = tlsCfg
	}
	if c.ConfigDir == "" {
		log.Warn("no --config directory: serving with no configuration, every request is OK")
	}
	srv, err := server.New(opts)
	if err != nil {
		log.Error("cannot start", "err", err.Error())
		return errReported
	}
	ctx, stop := stopOnSignal(srv)
	defer stop()
	if backend != nil {
		defer backend.Run(ctx, srv.SetServing)()
	}
	if err := srv.Serve(ctx); err != nil {
		log.Error("server failed", "err", err.Error())
		return errReported
	}
	return nil
}

// security is what serve reads from the files of its security flags.
type security struct {
	authz      *authz.Table
	debugToken string
}

// loadSecurity reads the authorization table and the debug token, and
// warns of a Redis password given on the command line and of profiles
// served beyond loopback with nothing guarding them.
func loadSecurity(c serveConfig, args []string, log *slog.Logger) (security, error) {
	var sec security
	if c.Authz != "" {
		b, err := os.ReadFile(c.Authz)
		if err != nil {
			return sec, fmt.Errorf("--authz: %v", err)
		}
		if sec.authz, err = authz.Parse(b); err != nil {
			return sec, fmt.Errorf("--authz %s: %v", c.Authz, err)
		}
	}
	if c.DebugTokenFile != "" {
		b, err := os.ReadFile(c.DebugTokenFile)
		if err != nil {
			return sec, fmt.Errorf("--debug-token-file: %v", err)
		}
		if sec.debugToken = strings.TrimSpace(string(b)); sec.debugToken == "" {
			return sec, fmt.Errorf("--debug-token-file %s: empty", c.DebugTokenFile)
		}
	}
	if u, err := redisstore.ParseURL(c.Redis.URL); err == nil && u.Password != "" &&
		slices.ContainsFunc(args, func(a string) bool { return strings.Contains(a, u.Password) }) {
		log.Warn("the Redis password in --redis-url shows in ps and /proc: use --redis-password-file, CHARON_REDIS_PASSWORD or REDIS_AUTH")
	}
	if host, _, err := net.SplitHostPort(c.DebugAddr); err == nil && c.Pprof && sec.debugToken == "" && !c.DebugTLS {
		if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
			log.Warn("--pprof on a debug port open beyond loopback with no --debug-token-file or --debug-tls", "debug_addr", c.DebugAddr)
		}
	}
	return sec, nil
}

// stopOnSignal is done on SIGTERM, with the drain of --shutdown-delay, or on
// SIGINT (an operator's Ctrl-C) without it; a second signal ends the drain.
func stopOnSignal(srv *server.Server) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	done := make(chan struct{})
	go func() {
		select {
		case sig := <-sigs:
			if sig == syscall.SIGINT {
				cancel(server.ErrStopNow)
			} else {
				cancel(nil)
			}
		case <-done:
			return
		}
		select {
		case <-sigs:
			srv.EndDrain()
		case <-done:
		}
	}()
	return ctx, func() {
		signal.Stop(sigs)
		close(done)
		cancel(nil)
	}
}
