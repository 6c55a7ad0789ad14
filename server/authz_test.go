package server

import (
	"context"
	"io"
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
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/internal/tlsconfig"
	"github.com/charonlimit/charon/internal/tlsconfig/tlstest"
)

// TestAuthz serves under mutual TLS with an authorization table: the
// gateway may ask for decisions only, a worker may also reserve, a client
// the CA vouches for but the table does not name may only check health.
// Refusals are PermissionDenied and counted by method group.
func TestAuthz(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "ca")
	cert, key := ca.Issue(t, dir, "charon.test", "127.0.0.1")
	srvTLS, err := tlsconfig.NewServer(tlsconfig.Options{CertFile: cert, KeyFile: key, ClientCAFile: ca.File})
	if err != nil {
		t.Fatal(err)
	}
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
	st := memstore.New(memstore.Options{})
	defer st.Close()
	mc := memcopy.New(memcopy.Options{})
	defer mc.Close()
	eng := engine.New(engine.Options{Store: st, Copies: mc})
	eng.SetTree(charonTree(t))
	s, stop := newTestServer(t, Options{Engine: eng, GRPCTLS: srvTLS.Config(), Authz: table})
	defer stop()

	conn := func(san string) *grpc.ClientConn {
		c, k := ca.Issue(t, dir, strings.NewReplacer("/", "_", ":", "_").Replace(san), san)
		cfg, err := tlsconfig.Client(tlsconfig.ClientOptions{CAFile: ca.File, ServerName: "charon.test", CertFile: c, KeyFile: k})
		if err != nil {
			t.Fatal(err)
		}
		cc, err := grpc.NewClient("passthrough:///"+s.GRPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return cc
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
		req, _ := http.NewRequest("GET", "http://"+addr+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
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
