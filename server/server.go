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

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/internal/authz"
	"github.com/charonlimit/charon/internal/decisionlog"
	"github.com/charonlimit/charon/internal/offenders"
	"github.com/charonlimit/charon/internal/rlqs"
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
type Options struct {
	GRPCAddr, HTTPAddr, DebugAddr string
	// MetricsAddr, when set, serves the metrics alone at MetricsPath
	// (default /metrics) on a listener of its own, for scrapers that must
	// not reach the debug port (envoyproxy/ratelimit's USE_PROMETHEUS).
	MetricsAddr, MetricsPath string

	Engine Decider

	// ConfigDir is watched every PollInterval; Load loads it (required with
	// ConfigDir).
	ConfigDir    string
	Load         LoadFunc
	PollInterval time.Duration
	// WaitForConfig, for a configuration delivered by ApplyConfig (xDS),
	// keeps health NOT_SERVING and answers ShouldRateLimit UNAVAILABLE
	// until the first one is applied, so that Envoy's failure_mode_deny
	// decides meanwhile. Without it, the server serves with no
	// configuration until then.
	WaitForConfig bool
	// WaitingFor, with WaitForConfig, says where the first configuration
	// is awaited from and what to do meanwhile (which setting to check or
	// change): it follows "no configuration yet" in the UNAVAILABLE answers
	// and /healthcheck.
	WaitingFor string

	// ResponseHeaders adds RateLimit-Limit, RateLimit-Remaining and
	// RateLimit-Reset to every response that has a limited status;
	// HeaderNames, when set, renames them (in that order).
	ResponseHeaders bool
	HeaderNames     [3]string
	// DraftHeaders adds the IETF draft's RateLimit-Policy and RateLimit
	// fields (draftheaders.go) to every response with a limited status.
	DraftHeaders bool
	// ShadowMode answers OK where the answer would be OVER_LIMIT (the
	// statuses keep their codes), counted: envoyproxy/ratelimit's global
	// SHADOW_MODE.
	ShadowMode bool
	// DynamicMetadata adds envoyproxy/ratelimit's dynamic_metadata to
	// every response (RESPONSE_DYNAMIC_METADATA).
	DynamicMetadata bool
	// Tracing traces every gRPC call (ShouldRateLimit, charon.v1) and HTTP
	// /json with OpenTelemetry's global tracer provider, continuing the
	// caller's trace (the global propagator's: internal/tracing's reads W3C
	// Trace Context and B3).
	Tracing bool
	// NearLimitRatio is the share of a limit from which granted hits count
	// as near_limit (0: 0.8).
	NearLimitRatio float64
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
	// of one gRPC connection, and of one HTTP/2 connection of the HTTP port.
	MaxConcurrentStreams uint32

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
	// DebugReset serves POST /reset on the debug port, which forgets pairs'
	// state; it needs DebugToken or a DebugTLS requiring client
	// certificates.
	DebugReset bool
	// Attribution says which answers name the rule that decided them, in
	// dynamic_metadata under AttributionKey (beside envoyproxy/ratelimit's
	// fields of DynamicMetadata); AttributionHeaders adds X-Charon-*
	// response headers too, which Envoy forwards to the client.
	Attribution        Attribution
	AttributionHeaders bool
	// Top, when set, tracks who is limited by which rule: GET /top and the
	// page at /ui/ on the debug port, and charon_top_hits with the top
	// TopMetrics values per rule and outcome (0: none), labelled with their
	// value when TopMetricsValues (else only their rank).
	Top              *offenders.Tracker
	TopMetrics       int
	TopMetricsValues bool
	// DecisionLog, when set, receives the decisions of ShouldRateLimit; its
	// counts are exported. The server does not close it.
	DecisionLog *decisionlog.Logger
	// Candidate, when set, decides every request again under a candidate
	// configuration, in shadow (see Candidate).
	Candidate Candidate
	// CandidateReloader, when set, watches the candidate's directory: Serve
	// polls it every PollInterval, as ConfigDir, and stops it before it
	// returns.
	CandidateReloader *Reloader

	Logger  *slog.Logger // nil: discard
	Metrics *Metrics     // nil: NewMetrics(nil)

	// RLQS, when set, serves envoy.service.rate_limit_quota.v3 with this
	// pipeline (Serve runs its ticks), its metrics and the debug port's
	// GET /rlqs.
	RLQS *rlqs.Allocator

	// Charon configures the charon.v1 service, registered when its Engine
	// (or Options.Engine) implements CharonEngine.
	Charon CharonOptions
}

// Server is a running Charon front end: its listeners are open once New
// returns. Use New, then Serve; methods are safe for concurrent use.
type Server struct {
	opts     Options
	log      *slog.Logger
	metrics  *Metrics
	rls      *rls
	charon   *charon // nil: charon.v1 not served
	rlqs     *rlqsService
	reloader *Reloader
	// candidate runs Options.Candidate's observations off the request path
	// (nil: no candidate).
	candidate *background
	health    *health.Server
	// applied is the configuration in force (nil before the first);
	// configReady is false while WaitForConfig waits for it, storeOK is
	// the store's health (SetServing); health is SERVING when both are
	// true, set under healthMu.
	applied     atomic.Pointer[appliedConfig]
	configReady atomic.Bool
	storeOK     atomic.Bool
	healthMu    sync.Mutex

	grpc                          *grpc.Server
	httpSrv, debugSrv, metricsSrv *http.Server
	grpcLis                       net.Listener
	httpLis, debugLis, metricsLis net.Listener

	shuttingDown atomic.Bool
	endDrain     chan struct{}
	endDrainOnce sync.Once
}

// New checks opts, loads the configuration (an invalid one is an error: the
// server does not start on a configuration it cannot use) and opens the
// listeners.
func New(opts Options) (*Server, error) {
	if opts.Engine == nil {
		return nil, errors.New("server: Options.Engine is required")
	}
	if opts.GRPCAddr == "" {
		return nil, errors.New("server: Options.GRPCAddr is required")
	}
	if opts.ConfigDir != "" && opts.Load == nil {
		return nil, errors.New("server: Options.Load is required with ConfigDir")
	}
	if err := checkDebugReset(&opts); err != nil {
		return nil, err
	}
	setDefault(&opts.PollInterval, DefaultPollInterval)
	setDefault(&opts.ShutdownTimeout, DefaultShutdownTimeout)
	setDefault(&opts.MaxRecvMsgSize, DefaultMaxRecvMsgSize)
	setDefault(&opts.HTTPReadTimeout, DefaultHTTPReadTimeout)
	setDefault(&opts.MaxConcurrentStreams, DefaultMaxConcurrentStreams)
	s := &Server{opts: opts, log: opts.Logger, metrics: opts.Metrics, endDrain: make(chan struct{})}
	if s.log == nil {
		s.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if s.metrics == nil {
		s.metrics = NewMetrics(nil)
	}
	if opts.ResponseHeaders {
		names := defaultHeaderNames
		for i, n := range opts.HeaderNames {
			if n != "" {
				names[i] = n
			}
		}
		opts.HeaderNames = names
	}
	if opts.NearLimitRatio > 0 {
		s.metrics.nearRatio = opts.NearLimitRatio
	}
	s.storeOK.Store(true)
	s.configReady.Store(!opts.WaitForConfig)
	if pe, ok := opts.Engine.(pacer); ok {
		s.metrics.registerPace(pe.Pace())
	}
	s.rls = &rls{engine: opts.Engine, metrics: s.metrics, log: s.log, responseHeaders: opts.ResponseHeaders, draftHeaders: opts.DraftHeaders,
		headerNames: opts.HeaderNames, shadowMode: opts.ShadowMode, dynamicMetadata: opts.DynamicMetadata,
		ready: &s.configReady, noConfig: noConfigError(opts.WaitingFor),
		attribution: opts.Attribution, attributionHeaders: opts.AttributionHeaders, observers: s.observers(&opts)}
	if opts.Top != nil {
		// A Metrics shared by several servers has it already.
		s.metrics.Registry.Register(newTopCollector(opts.Top, opts.TopMetrics, opts.TopMetricsValues))
	}
	if opts.Candidate != nil {
		s.metrics.Registry.MustRegister(opts.Candidate)
		s.metrics.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "charon", Subsystem: "candidate", Name: "dropped_total",
			Help: "Requests not decided under the candidate configuration because its queue was full (the live answer never waits for it).",
		}, func() float64 { return float64(s.candidate.Dropped()) }))
	}
	if opts.DecisionLog != nil {
		decisionLogCollector(s.metrics.Registry, opts.DecisionLog)
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
	s.grpc = grpc.NewServer(append(creds,
		grpc.MaxRecvMsgSize(opts.MaxRecvMsgSize),
		// RateLimitRequest bytes that are not UTF-8 are limited, not
		// refused (wire.go).
		grpc.ForceServerCodecV2(newCodec()),
		grpc.MaxConcurrentStreams(opts.MaxConcurrentStreams),
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
	)...)
	rlsv3.RegisterRateLimitServiceServer(s.grpc, s.rls)
	if ce := opts.Charon.Engine; ce != nil {
		s.charon = newCharon(ce, opts.Charon, s.metrics, s.log)
	} else if ce, ok := opts.Engine.(CharonEngine); ok {
		s.charon = newCharon(ce, opts.Charon, s.metrics, s.log)
	}
	if s.charon != nil {
		s.charon.candidate = opts.Candidate
		charonv1.RegisterCharonServer(s.grpc, s.charon)
	}
	if opts.RLQS != nil {
		s.rlqs = &rlqsService{a: opts.RLQS, closing: make(chan struct{})}
		rlqsv3.RegisterRateLimitQuotaServiceServer(s.grpc, s.rlqs)
		s.metrics.Registry.Register(rlqsCollector{opts.RLQS})
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
	if s.opts.ConfigDir != "" {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.reloader.Run(watchCtx, s.opts.PollInterval)
		}()
	}
	if r := s.opts.CandidateReloader; r != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.Run(watchCtx, cmp.Or(s.opts.PollInterval, DefaultPollInterval))
		}()
	}
	if s.rlqs != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.opts.RLQS.Run(watchCtx)
		}()
	}
	if s.candidate != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.candidate.run()
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
	if s.candidate != nil {
		// Nothing is decided any more: observe what is queued, then stop.
		close(s.candidate.stop)
	}
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
	if s.charon != nil {
		// Session streams would hold up a graceful stop: end them now.
		close(s.charon.closing)
	}
	if s.rlqs != nil {
		close(s.rlqs.closing) // Envoys reconnect elsewhere
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
