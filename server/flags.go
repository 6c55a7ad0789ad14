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
	"github.com/charonlimit/charon/internal/tlsconfig"
)

// Flags are the server's settings as command-line flags of charon serve:
// listeners, limits on clients, shutdown and security. They bind the
// fields of Options directly, and the files Resolve reads the
// certificates, the authorization table and the debug token from. The
// zero value is not useful; start from DefaultFlags.
type Flags struct {
	Options
	// TLS is the gRPC port's TLS (--grpc-tls-*), also the HTTP port's with
	// HTTPTLS and the debug port's with DebugTLS.
	TLS               tlsconfig.ServerFlags
	HTTPTLS, DebugTLS bool
	// AuthzFile is the authorization table file; DebugTokenFile holds the
	// debug port's bearer token.
	AuthzFile, DebugTokenFile string
}

// DefaultFlags returns the defaults of charon serve.
func DefaultFlags() Flags {
	return Flags{Options: Options{
		GRPCAddr:             ":8081",
		HTTPAddr:             ":8080",
		DebugAddr:            "127.0.0.1:6070",
		MetricsPath:          "/metrics",
		ShutdownTimeout:      10 * time.Second,
		ShutdownDelay:        5 * time.Second,
		HTTPReadTimeout:      DefaultHTTPReadTimeout,
		MaxConcurrentStreams: DefaultMaxConcurrentStreams,
	}}
}

// Bind declares the flags on fs with f's values as defaults.
func (f *Flags) Bind(fs *flag.FlagSet) {
	o := &f.Options
	fs.StringVar(&o.GRPCAddr, "grpc-addr", o.GRPCAddr, "gRPC listen `address`")
	fs.StringVar(&o.HTTPAddr, "http-addr", o.HTTPAddr, "HTTP listen `address` for /healthcheck and /json")
	fs.StringVar(&o.DebugAddr, "debug-addr", o.DebugAddr, "debug listen `address` for /metrics, /rlconfig, pprof")
	fs.StringVar(&o.MetricsAddr, "metrics-addr", o.MetricsAddr, "also serve the metrics alone on this `address`, at --metrics-path")
	fs.StringVar(&o.MetricsPath, "metrics-path", o.MetricsPath, "the `path` of --metrics-addr")
	fs.DurationVar(&o.MaxConnectionAge, "grpc-max-connection-age", o.MaxConnectionAge, "close gRPC connections after this age, so clients reconnect (and spread over new replicas); 0: never")
	fs.DurationVar(&o.MaxConnectionAgeGrace, "grpc-max-connection-age-grace", o.MaxConnectionAgeGrace, "time the RPCs of a connection closed for its age get to finish")
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", o.ShutdownTimeout, "time in-flight requests get after the drain")
	fs.DurationVar(&o.ShutdownDelay, "shutdown-delay", o.ShutdownDelay, "on SIGTERM, answer health NOT_SERVING but keep serving this long before stopping, so load balancers stop sending; SIGINT or a second signal skips it")
	fs.DurationVar(&o.HTTPReadTimeout, "http-read-timeout", o.HTTPReadTimeout, "time a client has to send a request's header and body on the HTTP and debug ports, and to finish a gRPC connection's handshake")
	fs.UintVar(&o.MaxConcurrentStreams, "max-concurrent-streams", o.MaxConcurrentStreams, "most concurrent RPCs and streams on one gRPC or HTTP/2 connection")
	f.TLS.Bind(fs, "grpc-tls-")
	fs.BoolVar(&f.HTTPTLS, "http-tls", f.HTTPTLS, "serve the HTTP port over TLS too, with the gRPC port's certificate and client CA")
	fs.StringVar(&f.AuthzFile, "authz", f.AuthzFile, "authorization table `file`: which client certificate identities may call which methods (gRPC, HTTP /json and a --debug-tls debug port); needs --grpc-tls-client-ca")
	fs.StringVar(&f.DebugTokenFile, "debug-token-file", f.DebugTokenFile, "require this `file`'s bearer token on every debug port request")
	fs.BoolVar(&f.DebugTLS, "debug-tls", f.DebugTLS, "serve the debug port over TLS too, with the gRPC port's certificate and client CA")
	fs.BoolVar(&o.Pprof, "pprof", o.Pprof, "serve Go profiles at /debug/pprof/ on the debug port")
}

// Check refuses values that cannot work, naming the flag; it reads no file.
func (f *Flags) Check() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	o := &f.Options
	if o.ShutdownTimeout <= 0 {
		bad("--shutdown-timeout must be positive")
	}
	if o.ShutdownDelay < 0 {
		bad("--shutdown-delay must not be negative")
	}
	if o.HTTPReadTimeout <= 0 {
		bad("--http-read-timeout must be positive")
	}
	if o.MaxConcurrentStreams < 1 || o.MaxConcurrentStreams > 1<<31-1 {
		bad("--max-concurrent-streams %d: want 1 to 2147483647", o.MaxConcurrentStreams)
	}
	if o.MaxConnectionAge < 0 || o.MaxConnectionAgeGrace < 0 {
		bad("--grpc-max-connection-age and its grace must not be negative")
	}
	if !strings.HasPrefix(o.MetricsPath, "/") {
		bad("--metrics-path %q: want a path starting with /", o.MetricsPath)
	}
	errs = append(errs, listenerClashes([]listener{
		{"--grpc-addr", o.GRPCAddr}, {"--http-addr", o.HTTPAddr}, {"--debug-addr", o.DebugAddr}, {"--metrics-addr", o.MetricsAddr},
	})...)
	if err := f.TLS.Check("grpc-tls-"); err != nil {
		errs = append(errs, err)
	}
	if f.HTTPTLS && !f.TLS.On() {
		bad("--http-tls needs --grpc-tls-cert and --grpc-tls-key")
	}
	if f.DebugTLS && !f.TLS.On() {
		bad("--debug-tls needs --grpc-tls-cert and --grpc-tls-key")
	}
	if f.AuthzFile != "" && f.TLS.ClientCA == "" {
		bad("--authz needs --grpc-tls-client-ca: identities come from client certificates")
	}
	return errors.Join(errs...)
}

// Resolve returns Options with the certificates, the authorization table
// and the debug token read from their files, and warns on log of profiles
// served beyond loopback with nothing guarding them.
func (f *Flags) Resolve(log *slog.Logger) (Options, error) {
	o := f.Options
	tlsCfg, err := f.TLS.Config()
	if err != nil {
		return o, err
	}
	o.GRPCTLS = tlsCfg
	if f.HTTPTLS {
		o.HTTPTLS = tlsCfg
	}
	if f.DebugTLS {
		o.DebugTLS = tlsCfg
	}
	if f.AuthzFile != "" {
		b, err := os.ReadFile(f.AuthzFile)
		if err != nil {
			return o, fmt.Errorf("--authz: %v", err)
		}
		if o.Authz, err = authz.Parse(b); err != nil {
			return o, fmt.Errorf("--authz %s: %v", f.AuthzFile, err)
		}
	}
	if f.DebugTokenFile != "" {
		b, err := os.ReadFile(f.DebugTokenFile)
		if err != nil {
			return o, fmt.Errorf("--debug-token-file: %v", err)
		}
		if o.DebugToken = strings.TrimSpace(string(b)); o.DebugToken == "" {
			return o, fmt.Errorf("--debug-token-file %s: empty: write a token into it (e.g. openssl rand -hex 32 > %s)", f.DebugTokenFile, f.DebugTokenFile)
		}
	}
	if host, _, err := net.SplitHostPort(o.DebugAddr); err == nil && o.Pprof && o.DebugToken == "" && !f.DebugTLS {
		if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
			log.Warn("--pprof on a debug port open beyond loopback with no --debug-token-file or --debug-tls: anyone who reaches it can profile the process; "+
				"bind --debug-addr to 127.0.0.1, or set --debug-token-file or --debug-tls", "debug_addr", o.DebugAddr)
		}
	}
	return o, nil
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
