package server

import (
	"context"
	"crypto/tls"
	"net/http"
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
	"github.com/charonlimit/charon/internal/copystore/memcopy"
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
		return nil
	}
	get := func(c *tls.Config) error { return getURL(c, "https://"+s.HTTPAddr()+"/healthcheck") }
	if err := get(withCert); err != nil {
		t.Errorf("HTTPS with a client certificate: %v", err)
	}
	if err := get(noCert); err == nil {
		t.Error("HTTPS without a client certificate accepted under mutual TLS")
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
// the CA vouches for but the table does not name may only check health.
// Refusals are PermissionDenied and counted by method group.
func TestAuthz(t *testing.T) {
	m, srvTLS := mutualTLS(t, "worker.test")
	table, err := authz.Parse([]byte(`
clients:
  - identity: spiffe://test/gateway
    allow: [rls]
  - identity: spiffe://test/jobs/*
    allow: [rls, reserve]
`))
	if err != nil {
		t.Fatal(err)
	}
	mc := memcopy.New(memcopy.Options{})
	defer mc.Close()
	eng, _ := charonEngine(t, mc)
	s, stop := newTestServer(t, Options{Engine: eng, GRPCTLS: srvTLS, Authz: table})
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
		_, err := charonv1.NewCharonClient(cc).Reserve(ctx, &charonv1.ReserveRequest{Resource: res("c", "db", "a"), Copies: 1})
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
	health := func(cc *grpc.ClientConn) error {
		_, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	gateway, worker, stranger := conn("spiffe://test/gateway"), conn("spiffe://test/jobs/w1"), conn("spiffe://test/stranger")
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
	if got := metricValue(t, s.metrics.authzDenied.WithLabelValues("rls")); got != 1 {
		t.Errorf("denied rls counted %v, want 1", got)
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
