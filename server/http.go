package server

import (
	"cmp"
	"crypto/subtle"
	"errors"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/pprof"
	"strconv"
	"strings"
	"unicode/utf8"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/authz"
	"github.com/charonlimit/charon/internal/sim"
)

// maxJSONBody bounds a /json request body.
const maxJSONBody = 1 << 20

// httpHandler serves /healthcheck, /json and the tier simulator at /sim/.
// With an authorization table, /json is allowed as ShouldRateLimit and the
// simulator as authz.Simulator; /healthcheck stays open to load balancers.
func (s *Server) httpHandler() http.Handler {
	guard := s.httpAuthz(true)
	mux := http.NewServeMux()
	mux.HandleFunc("/healthcheck", s.serveHealthcheck)
	mux.Handle("/json", s.traced("/json", guard(authz.ShouldRateLimit, http.HandlerFunc(s.serveJSON))))
	mux.Handle("/sim/", guard(authz.Simulator, http.StripPrefix("/sim", sim.Handler())))
	mux.Handle("GET /usage", guard(authz.Usage, http.HandlerFunc(s.serveUsage)))
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

// serveJSON is envoyproxy/ratelimit's /json endpoint: the RateLimitRequest as
// protojson in, the RateLimitResponse as protojson out, 429 when the overall
// code is OVER_LIMIT. Bad JSON and invalid requests get 400, other failures
// 500, another method than POST 405 with an example.
func (s *Server) serveJSON(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		// A browser's or a bare curl's GET: say how to ask instead.
		w.Header().Set("Allow", http.MethodPost)
		scheme := "http"
		if r.TLS != nil {
			scheme = "https"
		}
		http.Error(w, "POST a RateLimitRequest as JSON, e.g.\n  curl -s -XPOST "+scheme+"://"+descriptors.Truncate(cmp.Or(r.Host, "HOST:PORT"))+
			`/json -d '{"domain":"D","descriptors":[{"entries":[{"key":"K","value":"V"}]}]}'`+"\n(429 when OVER_LIMIT)", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxJSONBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			http.Error(w, "request body too large", http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "reading body: "+err.Error(), http.StatusBadRequest)
		return
	}
	var req rlsv3.RateLimitRequest
	if !utf8.Valid(body) {
		// Header bytes as Envoy forwards them: limited like any other
		// value, never an error (see wire.go). JSON text must be UTF-8, so
		// each stray byte is read as the character of that code (Latin-1).
		body = latin1Invalid(body)
	}
	if err := protojson.Unmarshal(body, &req); err != nil {
		http.Error(w, "invalid RateLimitRequest JSON: "+descriptors.Truncate(err.Error()), http.StatusBadRequest)
		return
	}
	resp, err := s.rls.ShouldRateLimit(r.Context(), &req)
	if err != nil {
		code := http.StatusInternalServerError
		if status.Code(err) == codes.InvalidArgument {
			code = http.StatusBadRequest
		}
		http.Error(w, status.Convert(err).Message(), code)
		return
	}
	out, err := protojson.Marshal(resp)
	if err != nil {
		http.Error(w, "encoding response: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
		w.WriteHeader(http.StatusTooManyRequests)
	}
	w.Write(out)
}

// debugHandler serves /metrics, /rlconfig and, when asked for, pprof. It
// listens on loopback by default: profiles and the configuration are not for
// the public. With a DebugToken every request must carry it, but for the
// live page's own files (uiPublic), which hold no data. Served over
// TLS with an authorization table, the table must allow the client each
// endpoint's name in package authz (group read, or admin for /reset).
func (s *Server) debugHandler() http.Handler {
	guard := s.httpAuthz(s.opts.DebugTLS != nil)
	mux := http.NewServeMux()
	mux.Handle("/metrics", guard(authz.DebugMetrics, s.promHandler()))
	mux.Handle("/rlconfig", guard(authz.DebugRLConfig, http.HandlerFunc(s.serveRLConfig)))
	mux.Handle("GET /explain", guard(authz.DebugExplain, http.HandlerFunc(s.serveExplain)))
	if s.opts.Candidate != nil {
		mux.Handle("GET /candidate", guard(authz.DebugExplain, s.opts.Candidate))
	}
	if s.opts.RLQS != nil {
		mux.Handle("GET /rlqs", guard(authz.DebugRLQS, http.HandlerFunc(s.serveRLQS)))
	}
	index := "/metrics: Prometheus metrics\n/rlconfig: the configuration in force\n" +
		"/explain?domain=D&descriptor=k=v,k2=v2: how a request resolves and its pairs' state (JSON)\n"
	if s.opts.Top != nil {
		mux.Handle("GET /top", guard(authz.DebugTop, http.HandlerFunc(s.serveTop)))
		mux.Handle("GET /ui/", guard(authz.DebugTop, uiHeaders(uiHandler())))
		index += "/top?domain=D&rule=R: who is being limited, by which rule (JSON)\n/ui/: the same, live\n"
	}
	if s.opts.DebugReset {
		mux.Handle("POST /reset", guard(authz.DebugReset, http.HandlerFunc(s.serveReset)))
		index += "POST /reset?domain=D&descriptor=k=v,k2=v2: forget those pairs' state\n"
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
	refusal := "a bearer token is required: send Authorization: Bearer TOKEN, TOKEN the content of the file given to --debug-token-file"
	if s.opts.Top != nil {
		refusal += "; in a browser, open /ui/ and enter the token there"
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The live page's files hold no data: a browser loads them, and
		// its login form, without the token (see uiPublic).
		if s.opts.Top != nil && uiPublicRequest(r) {
			mux.ServeHTTP(w, r)
			return
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

// latin1Invalid returns b with every byte that is not part of valid UTF-8
// replaced by the UTF-8 encoding of the character of that code.
func latin1Invalid(b []byte) []byte {
	out := make([]byte, 0, len(b)+8)
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n == 1 {
			out = utf8.AppendRune(out, rune(b[0]))
		} else {
			out = append(out, b[:n]...)
		}
		b = b[n:]
	}
	return out
}
