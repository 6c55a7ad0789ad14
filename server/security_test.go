package server

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
	"github.com/charonlimit/charon/internal/authz"
	"github.com/charonlimit/charon/internal/tlsconfig"
	"github.com/charonlimit/charon/internal/tlsconfig/tlstest"
)

// mutualTLS makes certificates for a server named charon.test and a client
// named client, and the server's TLS config, which requires a client
// certificate of the CA.
func mutualTLS(t *testing.T, client string) (*tlstest.Mutual, *tls.Config) {
	t.Helper()
	m := tlstest.NewMutual(t, "charon.test", client)
	srv, err := tlsconfig.NewServer(tlsconfig.Options{CertFile: m.CertFile, KeyFile: m.KeyFile, ClientCAFile: m.CA.File})
	if err != nil {
		t.Fatal(err)
	}
	return m, srv.Config()
}

// clientTLS is a client config that trusts m's CA and presents the given
// certificate, none when certFile is "".
func clientTLS(t *testing.T, m *tlstest.Mutual, certFile, keyFile string) *tls.Config {
	t.Helper()
	c, err := tlsconfig.Client(tlsconfig.ClientOptions{CAFile: m.CA.File, ServerName: m.ServerName, CertFile: certFile, KeyFile: keyFile})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// dialTLS connects to addr over TLS with cfg.
func dialTLS(t *testing.T, addr string, cfg *tls.Config) *grpc.ClientConn {
	t.Helper()
	return dial(t, addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
}

// TestTLSPorts serves gRPC and HTTP over mutual TLS: a client with a
// certificate of the CA is served on both; a plaintext client and a TLS
// client without a certificate are refused.
func TestTLSPorts(t *testing.T) {
	m, srvTLS := mutualTLS(t, "envoy.test")
	s, stop := newTestServer(t, Options{GRPCTLS: srvTLS, HTTPTLS: srvTLS, DebugTLS: srvTLS})
	defer stop()
	withCert, noCert := clientTLS(t, m, m.ClientCertFile, m.ClientKeyFile), clientTLS(t, m, "", "")

	check := func(cc *grpc.ClientConn) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	if err := check(dialTLS(t, s.GRPCAddr(), withCert)); err != nil {
		t.Errorf("gRPC with a client certificate: %v", err)
	}
	if err := check(dial(t, s.GRPCAddr())); err == nil {
		t.Error("plaintext gRPC accepted on a TLS port")
	}
	if err := check(dialTLS(t, s.GRPCAddr(), noCert)); err == nil {
		t.Error("gRPC without a client certificate accepted under mutual TLS")
	}

	getURL := func(c *tls.Config, url string) error {
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: c}, Timeout: 10 * time.Second}
		resp, err := hc.Get(url)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}
	// The HTTP port: every path with a certificate; without one only
	// /healthcheck (a kubelet's probe has none), every other path 403.
	for _, path := range []string{"/healthcheck", "/", "/sim/"} {
		if err := getURL(withCert, "https://"+s.HTTPAddr()+path); err != nil {
			t.Errorf("HTTPS %s with a client certificate: %v", path, err)
		}
	}
	if err := getURL(noCert, "https://"+s.HTTPAddr()+"/healthcheck"); err != nil {
		t.Errorf("HTTPS /healthcheck without a client certificate: %v", err)
	}
	for _, path := range []string{"/", "/sim/", "/json"} {
		if err := getURL(noCert, "https://"+s.HTTPAddr()+path); err == nil || !strings.Contains(err.Error(), "403") {
			t.Errorf("HTTPS %s without a client certificate: %v, want 403", path, err)
		}
	}
	// A certificate presented is verified: one of another CA is refused.
	other := tlstest.NewMutual(t, "charon.test", "stranger.test")
	stranger := clientTLS(t, m, other.ClientCertFile, other.ClientKeyFile)
	if err := getURL(stranger, "https://"+s.HTTPAddr()+"/healthcheck"); err == nil {
		t.Error("HTTPS with a certificate of another CA accepted")
	}
	if err := getURL(withCert, "https://"+s.DebugAddr()+"/metrics"); err != nil {
		t.Errorf("debug port over mutual TLS: %v", err)
	}
	if err := getURL(noCert, "https://"+s.DebugAddr()+"/metrics"); err == nil {
		t.Error("debug port: a client without a certificate accepted under mutual TLS")
	}
	hc := &http.Client{Timeout: 10 * time.Second}
	if resp, err := hc.Get("http://" + s.HTTPAddr() + "/healthcheck"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Error("plaintext HTTP served on a TLS port")
		}
	}
}

// TestAuthz serves under mutual TLS with an authorization table: the
// gateway may ask for decisions only, a worker may also reserve, a client
// the CA vouches for but the table does not name may only check health; a
// reader may read its usage, which the gateway may not. Refusals are PermissionDenied and counted by method group.
func TestAuthz(t *testing.T) {
	m, srvTLS := mutualTLS(t, "worker.test")
	table, err := authz.Parse([]byte(`
clients:
  - identity: spiffe://test/gateway
    allow: [rls]
  - identity: spiffe://test/jobs/*
    allow: [rls, reserve]
  - identity: spiffe://test/reader
    allow: [read]
`))
	if err != nil {
		t.Fatal(err)
	}
	s, stop := newTestServer(t, Options{GRPCTLS: srvTLS, Authz: table})
	defer stop()

	conn := func(san string) *grpc.ClientConn {
		c, k := m.CA.Issue(t, m.Dir, strings.NewReplacer("/", "_", ":", "_").Replace(san), san)
		return dialTLS(t, s.GRPCAddr(), clientTLS(t, m, c, k))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rls := func(cc *grpc.ClientConn) error {
		_, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "c",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("rate", "x")}})
		return err
	}
	reserve := func(cc *grpc.ClientConn) error {
		_, err := charonv1.NewCharonClient(cc).Reserve(ctx, &charonv1.ReserveRequest{Resource: &charonv1.Resource{Domain: "c"}, Copies: 1})
		return err
	}
	session := func(cc *grpc.ClientConn) error {
		st, err := charonv1.NewCharonClient(cc).Session(ctx)
		if err != nil {
			return err
		}
		_, err = st.Recv()
		return err
	}
	usage := func(cc *grpc.ClientConn) error {
		_, err := charonv1.NewCharonClient(cc).Usage(ctx, &charonv1.UsageRequest{Domain: "c",
			Descriptors: []*charonv1.ExplainRequest_Descriptor{{Entries: []*charonv1.Entry{{Key: "rate", Value: "x"}}}}})
		return err
	}
	health := func(cc *grpc.ClientConn) error {
		_, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	gateway, worker, stranger := conn("spiffe://test/gateway"), conn("spiffe://test/jobs/w1"), conn("spiffe://test/stranger")
	reader := conn("spiffe://test/reader")
	for _, c := range []struct {
		name string
		cc   *grpc.ClientConn
		call func(*grpc.ClientConn) error
		ok   bool
	}{
		{"gateway rls", gateway, rls, true},
		{"gateway reserve", gateway, reserve, false},
		{"gateway session", gateway, session, false},
		{"worker rls", worker, rls, true},
		{"worker reserve", worker, reserve, true},
		{"stranger rls", stranger, rls, false},
		{"stranger reserve", stranger, reserve, false},
		{"stranger health", stranger, health, true},
		{"gateway usage", gateway, usage, false},
		{"reader usage", reader, usage, true},
		{"reader rls", reader, rls, false},
	} {
		err := c.call(c.cc)
		switch {
		case c.ok && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case !c.ok && status.Code(err) != codes.PermissionDenied:
			t.Errorf("%s: %v, want PermissionDenied", c.name, err)
		}
	}
	if got := metricValue(t, s.metrics.authzDenied.WithLabelValues("reserve")); got != 3 {
		t.Errorf("denied reserves counted %v, want 3", got)
	}
	if got := metricValue(t, s.metrics.authzDenied.WithLabelValues("rls")); got != 2 {
		t.Errorf("denied rls counted %v, want 2", got)
	}
	if got := metricValue(t, s.metrics.authzDenied.WithLabelValues("read")); got != 1 {
		t.Errorf("denied reads counted %v, want 1", got)
	}
}

func TestAuthzNeedsTLS(t *testing.T) {
	_, err := New(Options{GRPCAddr: "127.0.0.1:0", Engine: &fakeEngine{}, Authz: &authz.Table{}})
	if err == nil || !strings.Contains(err.Error(), "Authz needs GRPCTLS") {
		t.Fatalf("New with Authz and no TLS: %v", err)
	}
}

// TestDebugPort: pprof is off unless asked for; with a token, every debug
// request needs it, and a wrong one is counted.
func TestDebugPort(t *testing.T) {
	get := func(addr, path, token string) (int, string) {
		t.Helper()
		body, code := fetch(t, "GET", "http://"+addr+path, token, "")
		return code, body
	}
	s, stop := newTestServer(t, Options{})
	if code, _ := get(s.DebugAddr(), "/debug/pprof/", ""); code != http.StatusNotFound {
		t.Errorf("pprof by default: %d, want 404", code)
	}
	if code, _ := get(s.DebugAddr(), "/metrics", ""); code != http.StatusOK {
		t.Errorf("metrics: %d", code)
	}
	stop()

	s, stop = newTestServer(t, Options{Pprof: true, DebugToken: "t0ken"})
	defer stop()
	for _, tok := range []string{"", "wrong", "t0ken2"} {
		if code, _ := get(s.DebugAddr(), "/metrics", tok); code != http.StatusUnauthorized {
			t.Errorf("token %q: %d, want 401", tok, code)
		}
	}
	if code, body := get(s.DebugAddr(), "/debug/pprof/", "t0ken"); code != http.StatusOK || !strings.Contains(body, "goroutine") {
		t.Errorf("pprof with the token: %d", code)
	}
	if code, _ := get(s.DebugAddr(), "/debug/pprof/cmdline", "t0ken"); code == http.StatusOK {
		t.Error("/debug/pprof/cmdline is served: it shows argv")
	}
	if got := metricValue(t, s.metrics.debugDenied); got != 3 {
		t.Errorf("debug refusals counted %v, want 3", got)
	}
}

// httpsClient is an HTTPS client that trusts m's CA and presents a new
// certificate of it naming san.
func httpsClient(t *testing.T, m *tlstest.Mutual, san string) *http.Client {
	t.Helper()
	c, k := m.CA.Issue(t, m.Dir, strings.NewReplacer("/", "_", ":", "_").Replace(san), san)
	return &http.Client{Transport: &http.Transport{TLSClientConfig: clientTLS(t, m, c, k)}, Timeout: 10 * time.Second}
}

func parseTable(t *testing.T, text string) *authz.Table {
	t.Helper()
	table, err := authz.Parse([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return table
}

// TestAuthzHTTP: the authorization table governs the HTTP port as it does
// gRPC. /json is ShouldRateLimit: a reader refused it over gRPC is refused
// it on /json (403, counted as rls), the gateway is served; the simulator
// needs read; /healthcheck stays open to load balancers. Over plaintext a
// request has no identity, so /json is refused.
func TestAuthzHTTP(t *testing.T) {
	m, srvTLS := mutualTLS(t, "unused.test")
	table := parseTable(t, `
clients:
  - identity: spiffe://test/reader
    allow: [read]
  - identity: spiffe://test/gateway
    allow: [rls]
`)
	s, stop := newTestServer(t, Options{GRPCTLS: srvTLS, HTTPTLS: srvTLS, Authz: table})
	defer stop()

	c, k := m.CA.Issue(t, m.Dir, "reader-grpc", "spiffe://test/reader")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := rlsv3.NewRateLimitServiceClient(dialTLS(t, s.GRPCAddr(), clientTLS(t, m, c, k))).ShouldRateLimit(ctx,
		&rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a", "x")}})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("reader ShouldRateLimit over gRPC: got %v, want PermissionDenied", err)
	}

	clients := map[string]*http.Client{}
	for _, who := range []string{"reader", "gateway", "stranger"} {
		clients[who] = httpsClient(t, m, "spiffe://test/"+who)
	}
	const req = `{"domain":"d","descriptors":[{"entries":[{"key":"a","value":"x"}]}]}`
	base := "https://" + s.HTTPAddr()
	for _, c := range []struct {
		who, method, path, body string
		want                    int
	}{
		{"reader", "POST", "/json", req, http.StatusForbidden},
		{"stranger", "POST", "/json", req, http.StatusForbidden},
		{"gateway", "POST", "/json", req, http.StatusOK},
		{"reader", "GET", "/sim/", "", http.StatusOK},
		{"gateway", "GET", "/sim/", "", http.StatusForbidden},
		{"stranger", "GET", "/healthcheck", "", http.StatusOK},
	} {
		if body, code := fetchWith(t, clients[c.who], c.method, base+c.path, "", c.body); code != c.want {
			t.Errorf("%s %s %s: got %d %.80q, want %d", c.who, c.method, c.path, code, body, c.want)
		}
	}
	if got := metricValue(t, s.metrics.authzDenied.WithLabelValues("rls")); got != 3 {
		t.Errorf("denied rls counted %v, want 3 (one gRPC call, two /json)", got)
	}
	if got := metricValue(t, s.metrics.authzDenied.WithLabelValues("read")); got != 1 {
		t.Errorf("denied reads counted %v, want 1", got)
	}

	// A plaintext HTTP port: no identity, so nothing but /healthcheck.
	s2, stop2 := newTestServer(t, Options{GRPCTLS: srvTLS, Authz: table})
	defer stop2()
	if body, code := post(t, "http://"+s2.HTTPAddr()+"/json", req); code != http.StatusForbidden || !strings.Contains(body, "needs a client certificate") {
		t.Errorf("plaintext POST /json under a table: got %d %q, want 403 asking for a client certificate", code, body)
	}
	if _, code := get(t, "http://"+s2.HTTPAddr()+"/healthcheck"); code != http.StatusOK {
		t.Errorf("plaintext /healthcheck under a table: got %d, want 200", code)
	}
}

// TestAuthzDebug: on a debug port served over mutual TLS, the table
// decides per endpoint: read for /metrics, /rlconfig, /explain, pprof and
// the index, admin for POST /reset, or a single endpoint's name. A token,
// when there is one, is still required first.
func TestAuthzDebug(t *testing.T) {
	m, srvTLS := mutualTLS(t, "unused.test")
	table := parseTable(t, `
clients:
  - identity: spiffe://test/reader
    allow: [read]
  - identity: spiffe://test/admin
    allow: [admin]
  - identity: spiffe://test/scraper
    allow: [/charon.debug/Metrics]
  - identity: spiffe://test/gateway
    allow: [rls]
`)
	s, stop := newTestServer(t, Options{GRPCTLS: srvTLS, DebugTLS: srvTLS, Authz: table, Pprof: true})
	clients := map[string]*http.Client{}
	for _, who := range []string{"reader", "admin", "scraper", "gateway"} {
		clients[who] = httpsClient(t, m, "spiffe://test/"+who)
	}
	q := "?domain=c&descriptor=" + url.QueryEscape("rate=x")
	base := "https://" + s.DebugAddr()
	for _, c := range []struct {
		who, method, path string
		want              int
	}{
		{"reader", "GET", "/", http.StatusOK},
		{"reader", "GET", "/metrics", http.StatusOK},
		{"reader", "GET", "/rlconfig", http.StatusServiceUnavailable}, // allowed: no configuration loaded
		{"reader", "GET", "/explain" + q, http.StatusOK},
		{"reader", "GET", "/debug/pprof/", http.StatusOK},
		{"reader", "POST", "/reset" + q, http.StatusForbidden},
		{"admin", "POST", "/reset" + q, http.StatusOK},
		{"admin", "GET", "/rlconfig", http.StatusForbidden},
		{"admin", "GET", "/explain" + q, http.StatusForbidden},
		{"scraper", "GET", "/metrics", http.StatusOK},
		{"scraper", "GET", "/rlconfig", http.StatusForbidden},
		{"scraper", "GET", "/debug/pprof/", http.StatusForbidden},
		{"gateway", "GET", "/metrics", http.StatusForbidden},
		{"gateway", "GET", "/", http.StatusForbidden},
		{"gateway", "GET", "/explain" + q, http.StatusForbidden},
		{"gateway", "POST", "/reset" + q, http.StatusForbidden},
	} {
		if body, code := fetchWith(t, clients[c.who], c.method, base+c.path, "", ""); code != c.want {
			t.Errorf("%s %s %s: got %d %.80q, want %d", c.who, c.method, c.path, code, body, c.want)
		}
	}
	if got := metricValue(t, s.metrics.authzDenied.WithLabelValues("admin")); got != 2 {
		t.Errorf("denied resets counted %v, want 2", got)
	}
	if got := metricValue(t, s.metrics.authzDenied.WithLabelValues("read")); got != 7 {
		t.Errorf("denied reads counted %v, want 7", got)
	}
	stop()

	// With a token too: the token first, then the table.
	s, stop = newTestServer(t, Options{GRPCTLS: srvTLS, DebugTLS: srvTLS, Authz: table, DebugToken: "t0ken"})
	defer stop()
	base = "https://" + s.DebugAddr()
	for _, c := range []struct {
		who, token string
		want       int
	}{
		{"reader", "", http.StatusUnauthorized},
		{"reader", "t0ken", http.StatusOK},
		{"gateway", "t0ken", http.StatusForbidden},
	} {
		if body, code := fetchWith(t, clients[c.who], "GET", base+"/metrics", c.token, ""); code != c.want {
			t.Errorf("%s with token %q: got %d %.80q, want %d", c.who, c.token, code, body, c.want)
		}
	}
}

// TestDebugAuthenticated: a debug port authenticates its clients with a
// token, or with a TLS, built by tlsconfig as serve builds it, that
// verifies client certificates; not with one that does not, nor in
// plaintext.
func TestDebugAuthenticated(t *testing.T) {
	m, mutual := mutualTLS(t, "unused.test")
	noCA, err := tlsconfig.NewServer(tlsconfig.Options{CertFile: m.CertFile, KeyFile: m.KeyFile})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		opts Options
		want bool
	}{
		{"plaintext", Options{}, false},
		{"token", Options{DebugToken: "t0ken"}, true},
		{"mutual TLS", Options{DebugTLS: mutual}, true},
		{"TLS without a client CA", Options{DebugTLS: noCA.Config()}, false},
		{"a bare TLS config", Options{DebugTLS: &tls.Config{}}, false},
	} {
		tc.opts.GRPCAddr, tc.opts.Engine = "127.0.0.1:0", &fakeEngine{}
		s, err := New(tc.opts)
		if err != nil {
			t.Fatal(err)
		}
		if got := s.DebugAuthenticated(); got != tc.want {
			t.Errorf("%s: DebugAuthenticated %v, want %v", tc.name, got, tc.want)
		}
		s.grpc.Stop()
		s.closeListeners()
	}
}
