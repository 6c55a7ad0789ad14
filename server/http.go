package server

import (
	"crypto/subtle"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/pprof"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/charonlimit/charon/internal/authz"
	"github.com/charonlimit/charon/internal/sim"
)

// httpHandler serves /healthcheck, the tier simulator at /sim/ and the
// services' endpoints (HandleHTTP: /json, /usage). With an authorization
// table, each is allowed under its name (the simulator as
// authz.Simulator); /healthcheck stays open to load balancers.
func (s *Server) httpHandler() http.Handler {
	guard := s.httpAuthz(true)
	mux := http.NewServeMux()
	mux.HandleFunc("/healthcheck", s.serveHealthcheck)
	mux.Handle("/sim/", guard(authz.Simulator, http.StripPrefix("/sim", sim.Handler())))
	for _, e := range s.httpEndpoints {
		h := guard(e.Name, e.Handler)
		if e.Traced {
			h = s.traced(e.path(), h)
		}
		mux.Handle(e.Pattern, h)
	}
	mux.HandleFunc("GET /{$}", s.serveRoot)
	return mux
}

// traced starts a server span for each request of route when tracing is on,
// as otelgrpc does for the gRPC calls: the caller's trace is taken from the
// headers by the global propagator (W3C Trace Context or B3, see
// internal/tracing), and the span, "METHOD route", carries OpenTelemetry's
// HTTP attributes; a 5xx answer is an error.
func (s *Server) traced(route string, h http.Handler) http.Handler {
	if !s.opts.Tracing {
		return h
	}
	tracer := otel.Tracer("github.com/charonlimit/charon/server")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := otel.GetTextMapPropagator().Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := tracer.Start(ctx, r.Method+" "+route, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("http.request.method", r.Method), attribute.String("http.route", route),
				attribute.String("url.path", r.URL.Path)))
		defer span.End()
		rec := &statusRecorder{ResponseWriter: w, code: http.StatusOK}
		h.ServeHTTP(rec, r.WithContext(ctx))
		span.SetAttributes(attribute.Int("http.response.status_code", rec.code))
		if rec.code >= 500 {
			span.SetStatus(otelcodes.Error, http.StatusText(rec.code))
		}
	})
}

// statusRecorder keeps the status code a handler answers.
type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.code = code
	r.ResponseWriter.WriteHeader(code)
}

// rootPage is the HTTP port's index: where a person who opens the port in
// a browser goes next. Like /healthcheck it is open to every client (it
// says nothing about the configuration).
const rootPage = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Charon</title>
<style>body{font:16px/1.5 system-ui,sans-serif;max-width:46em;margin:2em auto;padding:0 1em}code,pre{background:#f3f3f3}pre{padding:.5em;overflow-x:auto}</style>
</head><body>
<h1>Charon</h1>
<p>A rate limit service for Envoy. Its decisions are served over gRPC (envoy.service.ratelimit.v3 and charon.v1);
this HTTP port serves:</p>
<ul>
<li><a href="sim/">/sim/</a>: the tier simulator</li>
<li><a href="healthcheck">/healthcheck</a>: <code>OK</code> while serving</li>
<li><code>POST /json</code>: a RateLimitRequest as protobuf JSON in, the RateLimitResponse out (429 when OVER_LIMIT):
<pre>curl -s -XPOST http://HOST:PORT/json \
    -d '{"domain":"bench","descriptors":[{"entries":[{"key":"user","value":"alice"}]}]}'</pre></li>
</ul>
<p>The configuration, metrics and explanations are on the debug port (loopback by default).</p>
</body></html>
`

func (s *Server) serveRoot(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	page := rootPage
	if note := s.emptyNote(); note != "" {
		page = strings.Replace(page, "<h1>Charon</h1>", "<h1>Charon</h1>\n<p><strong>Warning: "+html.EscapeString(note)+".</strong></p>", 1)
	}
	io.WriteString(w, page)
}

// emptyNote is what the index pages and /rlconfig say when the
// configuration in force has no domain (and where it came from), or "".
func (s *Server) emptyNote() string {
	a := s.applied.Load()
	if a == nil || (a.cfg.Tree != nil && len(a.cfg.Tree.Domains()) > 0) {
		return ""
	}
	if a.source == "file" {
		return EmptyConfig + " (the directory " + s.opts.ConfigDir + " holds no domain file)"
	}
	return EmptyConfig + " (" + a.source + " sent none)"
}

func (s *Server) serveHealthcheck(w http.ResponseWriter, r *http.Request) {
	if s.shuttingDown.Load() {
		http.Error(w, "shutting down", http.StatusInternalServerError)
		return
	}
	if !s.serving() {
		msg := "store unavailable"
		if !s.configReady.Load() {
			msg = strings.TrimPrefix(noConfigError(s.opts.WaitingFor).Error(), "server: ")
		}
		http.Error(w, msg, http.StatusInternalServerError)
		return
	}
	io.WriteString(w, "OK")
}

// debugHandler serves /metrics, /rlconfig, the services' endpoints
// (HandleDebug: /explain, /top, ...) and, when asked for, pprof. It
// listens on loopback by default: profiles and the configuration are not
// for the public. With a DebugToken every request must carry it, but for
// the requests an endpoint serves publicly (Endpoint.Public: the live
// page's own files), which hold no data. Served over TLS with an
// authorization table, the table must allow the client each endpoint's
// name in package authz (group read, or admin for /reset).
func (s *Server) debugHandler() http.Handler {
	guard := s.httpAuthz(s.opts.DebugTLS != nil)
	mux := http.NewServeMux()
	mux.Handle("/metrics", guard(authz.DebugMetrics, s.promHandler()))
	mux.Handle("/rlconfig", guard(authz.DebugRLConfig, http.HandlerFunc(s.serveRLConfig)))
	index := "/metrics: Prometheus metrics\n/rlconfig: the configuration in force\n"
	refusal := "a bearer token is required: send Authorization: Bearer TOKEN, TOKEN the content of the file given to --debug-token-file"
	var public []func(*http.Request) bool
	for _, e := range s.debugEndpoints {
		mux.Handle(e.Pattern, guard(e.Name, e.Handler))
		index += e.Index
		if e.Public != nil {
			public = append(public, e.Public)
			refusal += "; in a browser, open " + e.path() + " and enter the token there"
		}
	}
	if s.opts.Pprof {
		mux.Handle("/debug/pprof/", guard(authz.DebugPprof, http.HandlerFunc(pprof.Index)))
		mux.Handle("/debug/pprof/profile", guard(authz.DebugPprof, http.HandlerFunc(pprof.Profile)))
		mux.Handle("/debug/pprof/symbol", guard(authz.DebugPprof, http.HandlerFunc(pprof.Symbol)))
		mux.Handle("/debug/pprof/trace", guard(authz.DebugPprof, http.HandlerFunc(pprof.Trace)))
		index += "/debug/pprof/: profiles\n"
	}
	mux.Handle("/{$}", guard(authz.DebugIndex, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if note := s.emptyNote(); note != "" {
			io.WriteString(w, "Warning: "+note+".\n\n")
		}
		io.WriteString(w, index)
	})))
	if s.opts.DebugToken == "" {
		return mux
	}
	want := []byte("Bearer " + s.opts.DebugToken)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, p := range public {
			if p(r) {
				mux.ServeHTTP(w, r)
				return
			}
		}
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			s.metrics.debugDenied.Inc()
			w.Header().Set("WWW-Authenticate", `Bearer realm="charon debug"`)
			http.Error(w, refusal, http.StatusUnauthorized)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// serveRLConfig dumps the configuration in force. One from elsewhere than
// files starts with a YAML comment naming its source and version
// ("# source: xds, version: 7").
func (s *Server) serveRLConfig(w http.ResponseWriter, r *http.Request) {
	a := s.applied.Load()
	if a == nil {
		http.Error(w, "no configuration loaded", http.StatusServiceUnavailable)
		return
	}
	out, err := a.cfg.Dump()
	if err != nil {
		http.Error(w, "dumping configuration: "+err.Error(), http.StatusInternalServerError)
		return
	}
	// YAML, shown by a browser rather than downloaded (application/yaml
	// would be): text/plain is what the debug port's other text pages say.
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if a.source != "file" {
		fmt.Fprintf(w, "# source: %s, version: %s\n", a.source, strconv.Quote(a.version))
	}
	if note := s.emptyNote(); note != "" {
		fmt.Fprintf(w, "# %s\n", note)
	}
	w.Write(out)
}
