package server

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/charonlimit/charon/internal/authz"
	"github.com/charonlimit/charon/internal/offenders"
	"github.com/charonlimit/charon/internal/tlsconfig"
)

// Flags are the server's settings as command-line flags of charon serve:
// listeners, answers, limits on clients, shutdown and security. The zero
// value is not useful; start from DefaultFlags.
type Flags struct {
	GRPCAddr, HTTPAddr, DebugAddr, MetricsAddr, MetricsPath string

	ResponseHeaders             bool
	DraftHeaders                bool
	HeaderNames                 [3]string
	ShadowMode, DynamicMetadata bool
	NearLimitRatio              float64

	MaxConnAge, MaxConnAgeGrace time.Duration
	ShutdownTimeout             time.Duration
	ShutdownDelay               time.Duration
	HTTPReadTimeout             time.Duration
	MaxStreams                  uint

	// TLS is the gRPC port's TLS (--grpc-tls-*), also the HTTP port's with
	// HTTPTLS and the debug port's with DebugTLS.
	TLS               tlsconfig.ServerFlags
	HTTPTLS, DebugTLS bool
	// Authz is the authorization table file; DebugTokenFile holds the
	// debug port's bearer token.
	Authz, DebugTokenFile string
	Pprof, DebugReset     bool

	// Attribution is off, limited or all; AttributionHeaders adds the
	// X-Charon-* headers.
	Attribution        string
	AttributionHeaders bool
	// TopK, TopRules and TopEpoch size the top offenders (TopK 0: not
	// tracked); TopMetrics and TopMetricsValues export them.
	TopK, TopRules, TopMetrics int
	TopEpoch                   time.Duration
	TopMetricsValues           bool
}

// DefaultFlags returns the defaults of charon serve.
func DefaultFlags() Flags {
	return Flags{
		GRPCAddr:         ":8081",
		HTTPAddr:         ":8080",
		DebugAddr:        "127.0.0.1:6070",
		MetricsPath:      "/metrics",
		HeaderNames:      [3]string{"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"},
		NearLimitRatio:   0.8,
		ShutdownTimeout:  10 * time.Second,
		ShutdownDelay:    5 * time.Second,
		HTTPReadTimeout:  DefaultHTTPReadTimeout,
		MaxStreams:       DefaultMaxConcurrentStreams,
		Attribution:      "limited",
		TopK:             offenders.DefaultK,
		TopRules:         offenders.DefaultMaxRules,
		TopEpoch:         offenders.DefaultEpoch,
		TopMetrics:       5,
		TopMetricsValues: true,
	}
}

var headerFlags = [3]string{"limit-header", "remaining-header", "reset-header"}

// Bind declares the flags on fs with f's values as defaults.
func (f *Flags) Bind(fs *flag.FlagSet) {
	fs.StringVar(&f.GRPCAddr, "grpc-addr", f.GRPCAddr, "gRPC listen `address`")
	fs.StringVar(&f.HTTPAddr, "http-addr", f.HTTPAddr, "HTTP listen `address` for /healthcheck and /json")
	fs.StringVar(&f.DebugAddr, "debug-addr", f.DebugAddr, "debug listen `address` for /metrics, /rlconfig, pprof")
	fs.StringVar(&f.MetricsAddr, "metrics-addr", f.MetricsAddr, "also serve the metrics alone on this `address`, at --metrics-path")
	fs.StringVar(&f.MetricsPath, "metrics-path", f.MetricsPath, "the `path` of --metrics-addr")
	fs.BoolVar(&f.ResponseHeaders, "response-headers", f.ResponseHeaders, "add RateLimit-Limit/-Remaining/-Reset response headers")
	fs.BoolVar(&f.DraftHeaders, "ratelimit-headers", f.DraftHeaders, "add the IETF draft's RateLimit-Policy and RateLimit response headers, one policy per rule")
	for i, what := range []string{"limit", "remaining", "reset"} {
		fs.StringVar(&f.HeaderNames[i], headerFlags[i], f.HeaderNames[i], "name of the "+what+" header of --response-headers")
	}
	fs.BoolVar(&f.ShadowMode, "shadow-mode", f.ShadowMode, "answer OK where the answer would be OVER_LIMIT (statuses keep their codes), counted in charon_global_shadow_mode_total")
	fs.BoolVar(&f.DynamicMetadata, "dynamic-metadata", f.DynamicMetadata, "add envoyproxy/ratelimit's dynamic_metadata to responses: domain, descriptors, hits and the metadata of the descriptors that passed")
	fs.Float64Var(&f.NearLimitRatio, "near-limit-ratio", f.NearLimitRatio, "share of a limit from which granted hits count as near_limit")
	fs.DurationVar(&f.MaxConnAge, "grpc-max-connection-age", f.MaxConnAge, "close gRPC connections after this age, so clients reconnect (and spread over new replicas); 0: never")
	fs.DurationVar(&f.MaxConnAgeGrace, "grpc-max-connection-age-grace", f.MaxConnAgeGrace, "time the RPCs of a connection closed for its age get to finish")
	fs.DurationVar(&f.ShutdownTimeout, "shutdown-timeout", f.ShutdownTimeout, "time in-flight requests get after the drain")
	fs.DurationVar(&f.ShutdownDelay, "shutdown-delay", f.ShutdownDelay, "on SIGTERM, answer health NOT_SERVING but keep serving this long before stopping, so load balancers stop sending; SIGINT or a second signal skips it")
	fs.DurationVar(&f.HTTPReadTimeout, "http-read-timeout", f.HTTPReadTimeout, "time a client has to send a request's header and body on the HTTP and debug ports, and to finish a gRPC connection's handshake")
	fs.UintVar(&f.MaxStreams, "max-concurrent-streams", f.MaxStreams, "most concurrent RPCs and streams on one gRPC or HTTP/2 connection")
	f.TLS.Bind(fs, "grpc-tls-")
	fs.BoolVar(&f.HTTPTLS, "http-tls", f.HTTPTLS, "serve the HTTP port over TLS too, with the gRPC port's certificate and client CA")
	fs.StringVar(&f.Authz, "authz", f.Authz, "authorization table `file`: which client certificate identities may call which methods (gRPC, HTTP /json and a --debug-tls debug port); needs --grpc-tls-client-ca")
	fs.StringVar(&f.DebugTokenFile, "debug-token-file", f.DebugTokenFile, "require this `file`'s bearer token on every debug port request")
	fs.BoolVar(&f.DebugTLS, "debug-tls", f.DebugTLS, "serve the debug port over TLS too, with the gRPC port's certificate and client CA")
	fs.BoolVar(&f.Pprof, "pprof", f.Pprof, "serve Go profiles at /debug/pprof/ on the debug port")
	fs.StringVar(&f.Attribution, "attribution", f.Attribution, "which answers name the rule that decided them in dynamic_metadata (key charon): off, limited (over the limit, shadow included) or all")
	fs.BoolVar(&f.AttributionHeaders, "attribution-headers", f.AttributionHeaders, "also add the attribution as X-Charon-Rule, -Rule-Name, -Resource, -Tier and -Retry-After response headers, which Envoy forwards to the client")
	fs.IntVar(&f.TopK, "top-k", f.TopK, "values tracked per rule and outcome for /top, /ui/ and charon_top_hits (0: no top offenders)")
	fs.IntVar(&f.TopRules, "top-rules", f.TopRules, "most rules whose top offenders are tracked at once")
	fs.DurationVar(&f.TopEpoch, "top-epoch", f.TopEpoch, "top offenders cover the current and the previous epoch of this length")
	fs.IntVar(&f.TopMetrics, "top-metrics", f.TopMetrics, "top values per rule and outcome exported as charon_top_hits (0: none)")
	fs.BoolVar(&f.TopMetricsValues, "top-metrics-values", f.TopMetricsValues, "label charon_top_hits with the values (at most 32 bytes, longer ones as a stand-in); false: only their rank")
	fs.BoolVar(&f.DebugReset, "debug-reset", f.DebugReset, "serve POST /reset on the debug port, which forgets pairs' state; needs --debug-token-file or --debug-tls with a client CA")
}

// Check refuses values that cannot work, naming the flag; it reads no file.
func (f *Flags) Check() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if f.ShutdownTimeout <= 0 {
		bad("--shutdown-timeout must be positive")
	}
	if f.ShutdownDelay < 0 {
		bad("--shutdown-delay must not be negative")
	}
	if f.HTTPReadTimeout <= 0 {
		bad("--http-read-timeout must be positive")
	}
	if f.MaxStreams < 1 || f.MaxStreams > 1<<31-1 {
		bad("--max-concurrent-streams %d: want 1 to 2147483647", f.MaxStreams)
	}
	if !(f.NearLimitRatio > 0 && f.NearLimitRatio <= 1) {
		bad("--near-limit-ratio %v: want more than 0, at most 1", f.NearLimitRatio)
	}
	if f.MaxConnAge < 0 || f.MaxConnAgeGrace < 0 {
		bad("--grpc-max-connection-age and its grace must not be negative")
	}
	for i, n := range f.HeaderNames {
		if n == "" || strings.ContainsAny(n, " \t\r\n:") {
			bad("--%s %q: not a header name", headerFlags[i], n)
		}
	}
	if !strings.HasPrefix(f.MetricsPath, "/") {
		bad("--metrics-path %q: want a path starting with /", f.MetricsPath)
	}
	errs = append(errs, listenerClashes([]listener{
		{"--grpc-addr", f.GRPCAddr}, {"--http-addr", f.HTTPAddr}, {"--debug-addr", f.DebugAddr}, {"--metrics-addr", f.MetricsAddr},
	})...)
	if _, err := ParseAttribution(f.Attribution); err != nil {
		bad("--attribution %v", err)
	}
	if f.TopK < 0 || f.TopK > 1024 {
		bad("--top-k %d: want 0 to 1024", f.TopK)
	}
	if f.TopRules < 1 || f.TopRules > 1<<16 {
		bad("--top-rules %d: want 1 to 65536", f.TopRules)
	}
	if f.TopEpoch < time.Second {
		bad("--top-epoch %v: want at least 1s", f.TopEpoch)
	}
	if f.TopMetrics < 0 || f.TopMetrics > max(f.TopK, 0) {
		bad("--top-metrics %d: want 0 to --top-k (%d)", f.TopMetrics, f.TopK)
	}
	if err := f.TLS.Check("grpc-tls-"); err != nil {
		errs = append(errs, err)
	}
	if f.HTTPTLS && !f.TLS.On() {
		bad("--http-tls needs --grpc-tls-cert and --grpc-tls-key")
	}
	if f.DebugTLS && !f.TLS.On() {
		bad("--debug-tls needs --grpc-tls-cert and --grpc-tls-key")
	}
	if f.Authz != "" && f.TLS.ClientCA == "" {
		bad("--authz needs --grpc-tls-client-ca: identities come from client certificates")
	}
	return errors.Join(errs...)
}

// Apply sets o's listener, answer and security fields from f, reading the
// certificates, the authorization table and the debug token, and warns on
// log of profiles served beyond loopback with nothing guarding them.
func (f *Flags) Apply(o *Options, log *slog.Logger) error {
	o.GRPCAddr, o.HTTPAddr, o.DebugAddr, o.MetricsAddr, o.MetricsPath = f.GRPCAddr, f.HTTPAddr, f.DebugAddr, f.MetricsAddr, f.MetricsPath
	o.ResponseHeaders, o.HeaderNames, o.ShadowMode, o.DynamicMetadata = f.ResponseHeaders, f.HeaderNames, f.ShadowMode, f.DynamicMetadata
	o.DraftHeaders = f.DraftHeaders
	o.NearLimitRatio, o.MaxConnectionAge, o.MaxConnectionAgeGrace = f.NearLimitRatio, f.MaxConnAge, f.MaxConnAgeGrace
	o.ShutdownTimeout, o.ShutdownDelay, o.HTTPReadTimeout = f.ShutdownTimeout, f.ShutdownDelay, f.HTTPReadTimeout
	o.MaxConcurrentStreams, o.Pprof, o.DebugReset = uint32(f.MaxStreams), f.Pprof, f.DebugReset
	o.Attribution, _ = ParseAttribution(f.Attribution)
	o.AttributionHeaders = f.AttributionHeaders
	if f.TopK > 0 {
		o.Top = offenders.NewTracker(offenders.Options{K: f.TopK, MaxRules: f.TopRules, Epoch: f.TopEpoch})
		o.TopMetrics, o.TopMetricsValues = f.TopMetrics, f.TopMetricsValues
	}
	tlsCfg, err := f.TLS.Config()
	if err != nil {
		return err
	}
	o.GRPCTLS = tlsCfg
	if f.HTTPTLS {
		o.HTTPTLS = tlsCfg
	}
	if f.DebugTLS {
		o.DebugTLS = tlsCfg
	}
	if f.Authz != "" {
		b, err := os.ReadFile(f.Authz)
		if err != nil {
			return fmt.Errorf("--authz: %v", err)
		}
		if o.Authz, err = authz.Parse(b); err != nil {
			return fmt.Errorf("--authz %s: %v", f.Authz, err)
		}
	}
	if f.DebugTokenFile != "" {
		b, err := os.ReadFile(f.DebugTokenFile)
		if err != nil {
			return fmt.Errorf("--debug-token-file: %v", err)
		}
		if o.DebugToken = strings.TrimSpace(string(b)); o.DebugToken == "" {
			return fmt.Errorf("--debug-token-file %s: empty: write a token into it (e.g. openssl rand -hex 32 > %s)", f.DebugTokenFile, f.DebugTokenFile)
		}
	}
	if host, _, err := net.SplitHostPort(f.DebugAddr); err == nil && f.Pprof && o.DebugToken == "" && !f.DebugTLS {
		if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
			log.Warn("--pprof on a debug port open beyond loopback with no --debug-token-file or --debug-tls: anyone who reaches it can profile the process; "+
				"bind --debug-addr to 127.0.0.1, or set --debug-token-file or --debug-tls", "debug_addr", f.DebugAddr)
		}
	}
	return nil
}

// listener is a listen address and the flag that sets it.
type listener struct{ flag, addr string }

// listenerClashes returns an error for each pair of listeners that the
// kernel would refuse to open together: the same port on the same host, or
// on any host when either listens on every address (":6070" takes
// 127.0.0.1:6070 too). Port 0 (a free port) and unset listeners never clash.
func listenerClashes(ls []listener) []error {
	var errs []error
	for i, a := range ls {
		ha, pa, err := net.SplitHostPort(a.addr)
		if a.addr == "" || err != nil || pa == "0" {
			continue
		}
		for _, b := range ls[i+1:] {
			hb, pb, err := net.SplitHostPort(b.addr)
			if b.addr == "" || err != nil || pb != pa {
				continue
			}
			if ha == hb || anyHost(ha) || anyHost(hb) {
				errs = append(errs, fmt.Errorf("%s %s and %s %s share port %s: give one of them another port (e.g. --debug-addr 127.0.0.1:6071 beside --metrics-addr :6070)",
					a.flag, a.addr, b.flag, b.addr, pa))
			}
		}
	}
	return errs
}

// anyHost reports whether a listen host means every address.
func anyHost(h string) bool {
	if h == "" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsUnspecified()
}
