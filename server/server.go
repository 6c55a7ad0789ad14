package server

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/authz"
)

// RLSServiceName is the gRPC service name that health checks may ask about.
const RLSServiceName = "envoy.service.ratelimit.v3.RateLimitService"

// healthNames are the health service names answered, with the same status:
// the server (""), the RLS service, and "ratelimit", the name
// envoyproxy/ratelimit's probes use.
var healthNames = []string{"", RLSServiceName, "ratelimit"}

// Defaults applied to zero Options fields.
const (
	DefaultPollInterval    = 500 * time.Millisecond
	DefaultShutdownTimeout = 10 * time.Second
	// DefaultMaxRecvMsgSize is gRPC's own default, stated: a message over it
	// is refused by gRPC with ResourceExhausted before it is decoded.
	DefaultMaxRecvMsgSize = 4 << 20
	// DefaultHTTPReadTimeout bounds reading a request on the HTTP ports.
	DefaultHTTPReadTimeout = 10 * time.Second
	// DefaultMaxConcurrentStreams is the streams one connection may have
	// open (Envoy opens another connection when it needs more).
	DefaultMaxConcurrentStreams = 1000
)

// ErrStopNow, as the cause of the context given to Serve, stops without the
// ShutdownDelay drain (an operator's Ctrl-C).
var ErrStopNow = errors.New("server: stop without draining")

// Options configure a Server. GRPCAddr and Engine are required; an empty
// HTTPAddr or DebugAddr disables that listener; an empty ConfigDir serves with
// no configuration (every request is OK, nothing limited) and watches nothing.
// charon serve binds the settings to its flags (Flags).
type Options struct {
	GRPCAddr, HTTPAddr, DebugAddr string
	// MetricsAddr, when set, serves the metrics alone at MetricsPath
	// (default /metrics) on a listener of its own, for scrapers that must
	// not reach the debug port (envoyproxy/ratelimit's USE_PROMETHEUS).
	MetricsAddr, MetricsPath string

	// Engine receives the descriptor tree of every configuration put in
	// force.
	Engine Engine

	// ConfigDir is watched every PollInterval; Load loads it (required with
	// ConfigDir).
	ConfigDir    string
	Load         LoadFunc
	PollInterval time.Duration
	// WaitForConfig, for a configuration delivered by ApplyConfig (xDS),
	// keeps health NOT_SERVING and makes Ready an error (the RLS service
	// answers UNAVAILABLE) until the first one is applied, so that Envoy's
	// failure_mode_deny decides meanwhile. Without it, the server serves
	// with no configuration until then.
	WaitForConfig bool
	// WaitingFor, with WaitForConfig, says where the first configuration
	// is awaited from and what to do meanwhile (which setting to check or
	// change): it follows "no configuration yet" in Ready's error and
	// /healthcheck.
	WaitingFor string

	// Tracing traces every gRPC call and the endpoints that ask for it
	// (Endpoint.Traced: /json) with OpenTelemetry's global tracer
	// provider, continuing the caller's trace (the global propagator's:
	// internal/tracing's reads W3C Trace Context and B3).
	Tracing bool
	// MaxConnectionAge and MaxConnectionAgeGrace, when positive, close a
	// gRPC connection after that age (clients reconnect, which spreads them
	// over new replicas), giving its RPCs the grace to finish.
	MaxConnectionAge, MaxConnectionAgeGrace time.Duration

	MaxRecvMsgSize  int
	ShutdownTimeout time.Duration
	// ShutdownDelay is the drain after the context of Serve is done:
	// health answers NOT_SERVING (and /healthcheck 500) while requests are
	// still served, so that load balancers stop sending, then the graceful
	// stop begins. A context canceled with the cause ErrStopNow skips it.
	ShutdownDelay time.Duration

	// HTTPReadTimeout bounds the reading of a request's header and body on
	// the HTTP and debug ports (slow clients are cut off).
	HTTPReadTimeout time.Duration
	// MaxConcurrentStreams caps the concurrent RPCs (and Session streams)
	// of one gRPC connection, and of one HTTP/2 connection of the HTTP
	// port; at most 2^31-1.
	MaxConcurrentStreams uint

	// GRPCTLS and HTTPTLS, when set, serve the gRPC and the HTTP port over
	// TLS (nil: plaintext). A config with client CAs verifies client
	// certificates (mutual TLS); see package tlsconfig.
	GRPCTLS, HTTPTLS *tls.Config

	// Authz, when set, is the authorization table of gRPC calls: a call
	// its client's certificate identities do not allow is refused with
	// PermissionDenied (health checks are always allowed). It needs a
	// GRPCTLS that verifies client certificates. It also governs the HTTP
	// port (/json as ShouldRateLimit; /healthcheck stays open) and, when
	// served over DebugTLS, the debug port, under the names of package
	// authz; a refused HTTP request, or one with no verified client
	// certificate, is answered 403.
	Authz *authz.Table

	// DebugToken, when set, is the bearer token every debug port request
	// must carry (Authorization: Bearer TOKEN). DebugTLS serves the debug
	// port over TLS (with client CAs: mutual TLS). Pprof serves
	// /debug/pprof/ on the debug port.
	DebugToken string
	DebugTLS   *tls.Config
	Pprof      bool

	Logger  *slog.Logger // nil: discard
	Metrics *Metrics     // nil: NewMetrics(nil)
}

// Engine is what the server needs of the decision pipeline: the tree of
// each configuration put in force; *engine.Engine implements it.
type Engine interface {
	SetTree(t *descriptors.Tree)
}

// Server is a running Charon front end: its listeners are open once New
// returns. Use New, then Serve; methods are safe for concurrent use.
type Server struct {
	opts     Options
	log      *slog.Logger
	metrics  *Metrics
	reloader *Reloader
	health   *health.Server
	// noConfig is Ready's error while WaitForConfig waits.
	noConfig error
	// applied is the configuration in force (nil before the first);
	// configReady is false while WaitForConfig waits for it, storeOK is
	// the store's health (SetServing); health is SERVING when both are
	// true, set under healthMu.
	applied     atomic.Pointer[appliedConfig]
	configReady atomic.Bool
	storeOK     atomic.Bool
	healthMu    sync.Mutex

	// What the services registered (register.go), in order.
	grpcServices                  []registered
	grpcOptions                   []grpc.ServerOption
	httpEndpoints, debugEndpoints []Endpoint
	tasks                         []func(context.Context)
	watched                       []*Reloader
	onShutdown                    []func()

	grpc                          *grpc.Server
	httpSrv, debugSrv, metricsSrv *http.Server
	grpcLis                       net.Listener
	httpLis, debugLis, metricsLis net.Listener

	shuttingDown atomic.Bool
	endDrain     chan struct{}
	endDrainOnce sync.Once
}

// New checks opts, has each service register (Service), loads the
// configuration (an invalid one is an error: the server does not start on
// a configuration it cannot use) and opens the listeners.
func New(opts Options, services ...Service) (*Server, error) {
	if opts.Engine == nil {
		return nil, errors.New("server: Options.Engine is required")
	}
	if opts.GRPCAddr == "" {
		return nil, errors.New("server: Options.GRPCAddr is required")
	}
	if opts.ConfigDir != "" && opts.Load == nil {
		return nil, errors.New("server: Options.Load is required with ConfigDir")
	}
	setDefault(&opts.PollInterval, DefaultPollInterval)
	setDefault(&opts.ShutdownTimeout, DefaultShutdownTimeout)
	setDefault(&opts.MaxRecvMsgSize, DefaultMaxRecvMsgSize)
	setDefault(&opts.HTTPReadTimeout, DefaultHTTPReadTimeout)
	setDefault(&opts.MaxConcurrentStreams, DefaultMaxConcurrentStreams)
	opts.MaxConcurrentStreams = min(opts.MaxConcurrentStreams, 1<<31-1)
	s := &Server{opts: opts, log: opts.Logger, metrics: opts.Metrics, endDrain: make(chan struct{}), noConfig: noConfigError(opts.WaitingFor)}
	if s.log == nil {
		s.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if s.metrics == nil {
		s.metrics = NewMetrics(nil)
	}
	s.storeOK.Store(true)
	s.configReady.Store(!opts.WaitForConfig)
	for _, svc := range services {
		if err := svc.Register(s); err != nil {
			return nil, err
		}
	}
	s.reloader = NewReloader(opts.ConfigDir, opts.Load, func(c *config.Config) { s.setConfig(c, "file", "") }, s.metrics, s.log)
	if opts.ConfigDir != "" {
		if _, err := s.reloader.Check(); err != nil {
			return nil, fmt.Errorf("server: loading %s: %w", opts.ConfigDir, err)
		}
	}

	s.health = health.NewServer()
	s.updateHealth()
	var creds []grpc.ServerOption
	if opts.GRPCTLS != nil {
		creds = append(creds, grpc.Creds(credentials.NewTLS(opts.GRPCTLS)))
	}
	if opts.Tracing {
		creds = append(creds, grpc.StatsHandler(otelgrpc.NewServerHandler()))
	}
	if opts.Authz != nil {
		if opts.GRPCTLS == nil {
			return nil, errors.New("server: Options.Authz needs GRPCTLS with client certificates")
		}
		creds = append(creds, grpc.ChainUnaryInterceptor(s.authzUnary), grpc.ChainStreamInterceptor(s.authzStream))
	}
	s.grpc = grpc.NewServer(append(append(creds,
		grpc.MaxRecvMsgSize(opts.MaxRecvMsgSize),
		grpc.MaxConcurrentStreams(uint32(opts.MaxConcurrentStreams)),
		// A connection must finish its TLS and HTTP/2 handshake in time.
		grpc.ConnectionTimeout(opts.HTTPReadTimeout),
		// Requests run on long-lived workers, whose stacks have grown
		// once, instead of a new goroutine each. 32 per CPU: with the Redis
		// store a handler waits on Redis for a round trip, and with too few
		// workers the requests in flight meanwhile each start a goroutine
		// and grow its stack again.
		grpc.NumStreamWorkers(uint32(32*runtime.GOMAXPROCS(0))),
		// Envoy pings idle connections; accept pings every 10 s, streams
		// or not, instead of closing the connection with ENHANCE_YOUR_CALM.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             10 * time.Second,
			PermitWithoutStream: true,
		}),
		// Ping idle connections, so that a Session stream whose client
		// vanished (network loss, a host gone) ends, releasing its holds.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 5 * time.Second, Timeout: 5 * time.Second,
			MaxConnectionAge: opts.MaxConnectionAge, MaxConnectionAgeGrace: opts.MaxConnectionAgeGrace}),
	), s.grpcOptions...)...)
	for _, r := range s.grpcServices {
		s.grpc.RegisterService(r.desc, r.impl)
	}
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)

	var err error
	if s.grpcLis, err = net.Listen("tcp", opts.GRPCAddr); err != nil {
		return nil, fmt.Errorf("server: gRPC listener: %w", err)
	}
	// The HTTP ports, each optional; a handler is built only for a port
	// that is served. Under mutual TLS the HTTP port lets a caller with no
	// certificate reach /healthcheck, and nothing else (healthOpen).
	httpTLS, certNeeded := healthOpen(opts.HTTPTLS)
	httpHandler := s.httpHandler
	if certNeeded {
		httpHandler = func() http.Handler { return certRequired(s.httpHandler()) }
	}
	for _, p := range []struct {
		name    string
		addr    string
		tls     *tls.Config
		lis     *net.Listener
		srv     **http.Server
		handler func() http.Handler
	}{
		{"HTTP", opts.HTTPAddr, httpTLS, &s.httpLis, &s.httpSrv, httpHandler},
		{"debug", opts.DebugAddr, opts.DebugTLS, &s.debugLis, &s.debugSrv, s.debugHandler},
		{"metrics", opts.MetricsAddr, nil, &s.metricsLis, &s.metricsSrv, s.metricsHandler},
	} {
		if p.addr == "" {
			continue
		}
		lis, err := net.Listen("tcp", p.addr)
		if err != nil {
			s.closeListeners()
			return nil, fmt.Errorf("server: %s listener: %w", p.name, err)
		}
		if p.tls != nil {
			lis = tls.NewListener(lis, p.tls)
		}
		*p.lis, *p.srv = lis, s.httpServer(p.handler())
	}
	return s, nil
}

// setDefault sets an option that is zero or negative to its default.
func setDefault[T cmp.Ordered](v *T, def T) {
	var zero T
	if *v <= zero {
		*v = def
	}
}

// metricsHandler serves the metrics at MetricsPath, /metrics by default.
func (s *Server) metricsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle(cmp.Or(s.opts.MetricsPath, "/metrics"), s.promHandler())
	return mux
}

// promHandler serves the metrics. A series that cannot be gathered (a
// mapping's series clashing with another) is left out and logged, rather
// than failing the whole scrape.
func (s *Server) promHandler() http.Handler {
	return promhttp.HandlerFor(s.metrics.gatherer(), promhttp.HandlerOpts{
		ErrorLog: promLog{s.log}, ErrorHandling: promhttp.ContinueOnError,
	})
}

// promLog writes promhttp's errors to the server's log.
type promLog struct{ log *slog.Logger }

func (l promLog) Println(v ...any) { l.log.Warn("serving metrics", "err", fmt.Sprint(v...)) }

// httpServer serves h with the slow-client bounds: the header and body of a
// request must arrive within HTTPReadTimeout, headers are at most 64 KiB,
// idle keep-alive connections close after two minutes, and an HTTP/2
// connection has at most MaxConcurrentStreams streams. Writes are not
// bounded: a CPU profile streams for as long as it was asked to run.
func (s *Server) httpServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: s.opts.HTTPReadTimeout,
		ReadTimeout:       s.opts.HTTPReadTimeout,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		HTTP2:             &http.HTTP2Config{MaxConcurrentStreams: int(s.opts.MaxConcurrentStreams)},
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
}

func (s *Server) closeListeners() {
	for _, l := range []net.Listener{s.grpcLis, s.httpLis, s.debugLis, s.metricsLis} {
		if l != nil {
			l.Close()
		}
	}
}

// GRPCAddr returns the gRPC listener's address.
func (s *Server) GRPCAddr() string { return s.grpcLis.Addr().String() }

// HTTPAddr returns the HTTP listener's address, or "" when disabled.
func (s *Server) HTTPAddr() string { return addrOf(s.httpLis) }

// DebugAddr returns the debug listener's address, or "" when disabled.
func (s *Server) DebugAddr() string { return addrOf(s.debugLis) }

// MetricsAddr returns the metrics listener's address, or "" when disabled.
func (s *Server) MetricsAddr() string { return addrOf(s.metricsLis) }

func addrOf(l net.Listener) string {
	if l == nil {
		return ""
	}
	return l.Addr().String()
}

// Reloader returns the configuration watcher (for a manual Check).
func (s *Server) Reloader() *Reloader { return s.reloader }

// Metrics returns the server's metrics.
func (s *Server) Metrics() *Metrics { return s.metrics }

// Serve serves until ctx is done, then shuts down gracefully: health turns
// NOT_SERVING and /healthcheck 500, requests are still served for
// ShutdownDelay (unless ctx's cause is ErrStopNow), then in-flight RPCs
// finish until ShutdownTimeout, and the rest is cut. It returns nil after a shutdown
// asked by ctx, or the first listener error.
func (s *Server) Serve(ctx context.Context) error {
	errc := make(chan error, 4)
	var wg sync.WaitGroup
	run := func(name string, f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, grpc.ErrServerStopped) {
				errc <- fmt.Errorf("server: %s: %w", name, err)
			}
		}()
	}
	run("gRPC", func() error { return s.grpc.Serve(s.grpcLis) })
	if s.httpSrv != nil {
		run("HTTP", func() error { return s.httpSrv.Serve(s.httpLis) })
	}
	if s.debugSrv != nil {
		run("debug", func() error { return s.debugSrv.Serve(s.debugLis) })
	}
	if s.metricsSrv != nil {
		run("metrics", func() error { return s.metricsSrv.Serve(s.metricsLis) })
	}
	watchCtx, stopWatch := context.WithCancel(context.Background())
	watch := func(r *Reloader) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.Run(watchCtx, s.opts.PollInterval)
		}()
	}
	if s.opts.ConfigDir != "" {
		watch(s.reloader)
	}
	for _, r := range s.watched {
		watch(r)
	}
	// The services' tasks outlive the listeners: they end once the last
	// requests are answered.
	taskCtx, stopTasks := context.WithCancel(context.Background())
	for _, f := range s.tasks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(taskCtx)
		}()
	}
	s.log.Info("serving", "grpc", s.GRPCAddr(), "http", s.HTTPAddr(), "debug", s.DebugAddr(), "config", s.opts.ConfigDir)

	var err error
	select {
	case <-ctx.Done():
		if d := s.opts.ShutdownDelay; d > 0 && !errors.Is(context.Cause(ctx), ErrStopNow) {
			err = s.drain(d, errc)
		}
	case err = <-errc:
	}
	stopWatch()
	s.shutdown()
	stopTasks()
	wg.Wait()
	return err
}

// drain turns health NOT_SERVING and keeps serving for d (or until a
// listener fails: its error is returned), so that load balancers stop
// sending first.
func (s *Server) drain(d time.Duration, errc <-chan error) error {
	s.log.Info("draining: health is NOT_SERVING, requests are still served", "delay", d)
	s.shuttingDown.Store(true)
	s.health.Shutdown()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-s.endDrain:
		return nil
	case err := <-errc:
		return err
	}
}

// EndDrain ends the ShutdownDelay drain now (a second signal), or skips
// it if it has not begun.
func (s *Server) EndDrain() { s.endDrainOnce.Do(func() { close(s.endDrain) }) }

func (s *Server) shutdown() {
	s.log.Info("shutting down", "timeout", s.opts.ShutdownTimeout)
	s.shuttingDown.Store(true)
	s.health.Shutdown()
	for _, f := range s.onShutdown {
		// Streams would hold up a graceful stop: the services end them now.
		f()
	}
	deadline, cancel := context.WithTimeout(context.Background(), s.opts.ShutdownTimeout)
	defer cancel()

	done := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(done)
	}()
	if s.httpSrv != nil {
		if err := s.httpSrv.Shutdown(deadline); err != nil {
			s.httpSrv.Close()
		}
	}
	select {
	case <-done:
	case <-deadline.Done():
		s.log.Warn("shutdown deadline passed; closing remaining connections")
		s.grpc.Stop()
		<-done
	}
	if s.debugSrv != nil {
		s.debugSrv.Close()
	}
	if s.metricsSrv != nil {
		s.metricsSrv.Close()
	}
	s.log.Info("stopped")
}
