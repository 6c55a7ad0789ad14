package rls

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/charonlimit/charon/internal/authz"
	"github.com/charonlimit/charon/internal/decisionlog"
	"github.com/charonlimit/charon/internal/offenders"
	"github.com/charonlimit/charon/server"
)

// Options configure the RLS service: its answers (headers, shadow mode,
// dynamic metadata, attribution), who is limited (top offenders) and the
// metric names. charon serve binds the settings to its flags (Bind); start
// from DefaultOptions there. The zero value is usable: no headers, no
// attribution, no top offenders, Charon's metric names only.
type Options struct {
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
	// NearLimitRatio is the share of a limit from which granted hits count
	// as near_limit (0: 0.8).
	NearLimitRatio float64
	// Attribution says which answers name the rule that decided them, in
	// dynamic_metadata under AttributionKey (beside envoyproxy/ratelimit's
	// fields of DynamicMetadata); AttributionHeaders adds X-Charon-*
	// response headers too, which Envoy forwards to the client.
	Attribution        Attribution
	AttributionHeaders bool
	// TopK, when positive, tracks who is limited by which rule, TopK values
	// per rule and outcome, for at most TopRules rules over the current and
	// the previous TopEpoch (package offenders; 0: its defaults): GET /top
	// and the page at /ui/ on the debug port, and charon_top_hits with the
	// top TopMetrics values per rule and outcome (0: none), labelled with
	// their value when TopMetricsValues (else only their rank).
	TopK, TopRules   int
	TopEpoch         time.Duration
	TopMetrics       int
	TopMetricsValues bool
	// LyftMetrics counts under envoyproxy/ratelimit's Prometheus names too
	// (ratelimit_service_*), unless MappedStats makes them from its statsd
	// stats.
	LyftMetrics bool

	// Set by the caller, not flags:
	//
	// DecisionLog, when set, receives the decisions; its counts are
	// exported. The service does not close it.
	DecisionLog *decisionlog.Logger
	// Candidate, when set, decides every request again under a candidate
	// configuration, in shadow (see Candidate); CandidateWatch, when set,
	// is the watcher of its directory, polled while the server serves.
	Candidate      Candidate
	CandidateWatch *server.Reloader
	// Stats, when set, receives envoyproxy/ratelimit's statsd stats (with
	// its names; package statsd sends them).
	Stats StatsSink
	// MappedStats, when set, receives the statsd stats too and makes
	// Prometheus series of them, served beside the registry's in place of
	// LyftMetrics' names (a series both made would be served by neither).
	MappedStats MappedStats
}

// DefaultOptions are charon serve's defaults.
func DefaultOptions() Options {
	return Options{
		HeaderNames:      defaultHeaderNames,
		NearLimitRatio:   0.8,
		Attribution:      AttributionLimited,
		TopK:             offenders.DefaultK,
		TopRules:         offenders.DefaultMaxRules,
		TopEpoch:         offenders.DefaultEpoch,
		TopMetrics:       5,
		TopMetricsValues: true,
		LyftMetrics:      true,
	}
}

var headerFlags = [3]string{"limit-header", "remaining-header", "reset-header"}

// Bind declares the service's flags on fs with o's values as defaults.
func (o *Options) Bind(fs *flag.FlagSet) {
	fs.BoolVar(&o.ResponseHeaders, "response-headers", o.ResponseHeaders, "add RateLimit-Limit/-Remaining/-Reset response headers")
	fs.BoolVar(&o.DraftHeaders, "ratelimit-headers", o.DraftHeaders, "add the IETF draft's RateLimit-Policy and RateLimit response headers, one policy per rule")
	for i, what := range []string{"limit", "remaining", "reset"} {
		fs.StringVar(&o.HeaderNames[i], headerFlags[i], o.HeaderNames[i], "name of the "+what+" header of --response-headers")
	}
	fs.BoolVar(&o.ShadowMode, "shadow-mode", o.ShadowMode, "answer OK where the answer would be OVER_LIMIT (statuses keep their codes), counted in charon_global_shadow_mode_total")
	fs.BoolVar(&o.DynamicMetadata, "dynamic-metadata", o.DynamicMetadata, "add envoyproxy/ratelimit's dynamic_metadata to responses: domain, descriptors, hits and the metadata of the descriptors that passed")
	fs.Float64Var(&o.NearLimitRatio, "near-limit-ratio", o.NearLimitRatio, "share of a limit from which granted hits count as near_limit")
	fs.Var(&o.Attribution, "attribution", "which answers name the rule that decided them in dynamic_metadata (key charon): off, limited (over the limit, shadow included) or all")
	fs.BoolVar(&o.AttributionHeaders, "attribution-headers", o.AttributionHeaders, "also add the attribution as X-Charon-Rule, -Rule-Name, -Resource, -Tier and -Retry-After response headers, which Envoy forwards to the client")
	fs.IntVar(&o.TopK, "top-k", o.TopK, "values tracked per rule and outcome for /top, /ui/ and charon_top_hits (0: no top offenders)")
	fs.IntVar(&o.TopRules, "top-rules", o.TopRules, "most rules whose top offenders are tracked at once")
	fs.DurationVar(&o.TopEpoch, "top-epoch", o.TopEpoch, "top offenders cover the current and the previous epoch of this length")
	fs.IntVar(&o.TopMetrics, "top-metrics", o.TopMetrics, "top values per rule and outcome exported as charon_top_hits (0: none)")
	fs.BoolVar(&o.TopMetricsValues, "top-metrics-values", o.TopMetricsValues, "label charon_top_hits with the values (at most 32 bytes, longer ones as a stand-in); false: only their rank")
	fs.BoolVar(&o.LyftMetrics, "lyft-metrics", o.LyftMetrics, "also count under envoyproxy/ratelimit's Prometheus names (ratelimit_service_*)")
}

// Check refuses values that cannot work, naming the flag.
func (o *Options) Check() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if !(o.NearLimitRatio > 0 && o.NearLimitRatio <= 1) {
		bad("--near-limit-ratio %v: want more than 0, at most 1", o.NearLimitRatio)
	}
	for i, n := range o.HeaderNames {
		if n == "" || strings.ContainsAny(n, " \t\r\n:") {
			bad("--%s %q: not a header name", headerFlags[i], n)
		}
	}
	if o.TopK < 0 || o.TopK > 1024 {
		bad("--top-k %d: want 0 to 1024", o.TopK)
	}
	if o.TopRules < 1 || o.TopRules > 1<<16 {
		bad("--top-rules %d: want 1 to 65536", o.TopRules)
	}
	if o.TopEpoch < time.Second {
		bad("--top-epoch %v: want at least 1s", o.TopEpoch)
	}
	if o.TopMetrics < 0 || o.TopMetrics > max(o.TopK, 0) {
		bad("--top-metrics %d: want 0 to --top-k (%d)", o.TopMetrics, o.TopK)
	}
	return errors.Join(errs...)
}

// String implements flag.Value.
func (a *Attribution) String() string {
	if a == nil {
		return ""
	}
	return [...]string{"off", "limited", "all"}[min(int(*a), 2)]
}

// Set implements flag.Value: off, limited or all.
func (a *Attribution) Set(s string) error {
	v, err := ParseAttribution(s)
	if err == nil {
		*a = v
	}
	return err
}

// New returns the RLS service of eng with opts. It serves once registered
// on a server (server.New registers it): its metrics live in the server's
// registry.
func New(eng Decider, opts Options) *Service {
	s := &Service{engine: eng, opts: opts, log: slog.New(slog.DiscardHandler), responseHeaders: opts.ResponseHeaders, draftHeaders: opts.DraftHeaders,
		headerNames: defaultHeaderNames, shadowMode: opts.ShadowMode, dynamicMetadata: opts.DynamicMetadata,
		attribution: opts.Attribution, attributionHeaders: opts.AttributionHeaders}
	for i, n := range opts.HeaderNames {
		if n != "" {
			s.headerNames[i] = n
		}
	}
	if opts.TopK > 0 {
		s.top = offenders.NewTracker(offenders.Options{K: opts.TopK, MaxRules: opts.TopRules, Epoch: opts.TopEpoch})
	}
	if opts.Candidate != nil {
		s.candidate = newBackground(opts.Candidate, candidateQueue)
	}
	return s
}

// Register implements server.Service: the gRPC service and its codec,
// /json on the HTTP port, the metrics, and what the options ask for: the
// top offenders (/top, /ui/ and charon_top_hits), the candidate (its
// observer's goroutine, GET /candidate, its metrics and its directory's
// watcher), the decision log's counts.
func (s *Service) Register(srv *server.Server) error {
	s.srv, s.log = srv, srv.Logger()
	sm := srv.Metrics()
	reg := sm.Registry
	var err error
	if s.metrics, err = newMetrics(reg); err != nil {
		return fmt.Errorf("rls: %w", err)
	}
	if r := s.opts.NearLimitRatio; r > 0 {
		s.metrics.nearRatio = r
	}
	switch {
	case s.opts.MappedStats != nil:
		s.metrics.SendStats(s.opts.MappedStats)
		sm.Gather(s.opts.MappedStats)
	case s.opts.LyftMetrics:
		if err := s.metrics.LyftNames(); err != nil {
			return fmt.Errorf("rls: %w", err)
		}
	}
	if s.opts.Stats != nil {
		s.metrics.SendStats(s.opts.Stats)
	}
	sm.OnReload(s.metrics.reloaded)
	if pe, ok := s.engine.(pacer); ok {
		if err := s.metrics.registerPace(pe.Pace()); err != nil {
			return fmt.Errorf("rls: %w", err)
		}
	}
	s.observers = s.observersOf()
	if s.top != nil {
		// A Metrics shared by several servers has it already.
		_ = reg.Register(newTopCollector(s.top, s.opts.TopMetrics, s.opts.TopMetricsValues))
		srv.HandleDebug(server.Endpoint{Pattern: "GET /top", Name: authz.DebugTop, Handler: http.HandlerFunc(s.serveTop),
			Index: "/top?domain=D&rule=R: who is being limited, by which rule (JSON)\n"})
		srv.HandleDebug(server.Endpoint{Pattern: "GET /ui/", Name: authz.DebugTop, Handler: uiHeaders(uiHandler()),
			Index: "/ui/: the same, live\n", Public: uiPublicRequest})
	}
	if c := s.opts.Candidate; c != nil {
		b := s.candidate
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("rls: candidate: %w", err)
		}
		if err := reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "charon", Subsystem: "candidate", Name: "dropped_total",
			Help: "Requests not decided under the candidate configuration because its queue was full (the live answer never waits for it).",
		}, func() float64 { return float64(b.Dropped()) })); err != nil {
			return fmt.Errorf("rls: candidate: %w", err)
		}
		// Nothing is decided once the server has stopped: observe what is
		// queued, then stop.
		srv.Go(b.run)
		srv.HandleDebug(server.Endpoint{Pattern: "GET /candidate", Name: authz.DebugExplain, Handler: c})
		if w := s.opts.CandidateWatch; w != nil {
			srv.Watch(w)
		}
	}
	if s.opts.DecisionLog != nil {
		if err := decisionLogCollector(reg, s.opts.DecisionLog); err != nil {
			return fmt.Errorf("rls: %w", err)
		}
	}
	rlsv3.RegisterRateLimitServiceServer(srv, s)
	// RateLimitRequest bytes that are not UTF-8 are limited, not refused
	// (wire.go).
	srv.GRPCOption(grpc.ForceServerCodecV2(newCodec()))
	srv.HandleHTTP(server.Endpoint{Pattern: "/json", Name: authz.ShouldRateLimit, Handler: http.HandlerFunc(s.serveJSON), Traced: true})
	return nil
}
