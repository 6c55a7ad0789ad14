package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
	"github.com/charonlimit/charon/internal/redistest"
	"github.com/charonlimit/charon/internal/tlsconfig"
	"github.com/charonlimit/charon/internal/tlsconfig/tlstest"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

func writeFile(t *testing.T, dir, name, body string) string {
	t.Helper()
	f := filepath.Join(dir, name)
	if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestServeAuthz starts `charon serve` with mutual TLS, an authorization
// table and a debug token: the gateway's certificate may ask for decisions
// but not reserve; a certificate of the same CA the table does not name
// cannot take a single copy; refusals are counted on /metrics, which needs
// the token.
func TestServeAuthz(t *testing.T) {
	m := tlstest.NewMutual(t, "charon.test", "unused.test")
	dir, ca, cert, key := m.Dir, m.CA, m.CertFile, m.KeyFile
	table := writeFile(t, dir, "authz.yaml", "clients:\n  - identity: spiffe://test/gateway\n    allow: [rls]\n  - identity: spiffe://test/jobs/*\n    allow: [rls, reserve]\n")
	token := writeFile(t, dir, "token", "s3cret-token\n")
	p := startServeEnv(t, buildCharon(t), nil, "--config", "../../examples/config",
		"--grpc-tls-cert", cert, "--grpc-tls-key", key, "--grpc-tls-client-ca", ca.File,
		"--authz", table, "--debug-token-file", token)
	conn := func(name, san string) *grpc.ClientConn {
		c, k := ca.Issue(t, dir, name, san)
		cfg, err := tlsconfig.Client(tlsconfig.ClientOptions{CAFile: ca.File, ServerName: "charon.test", CertFile: c, KeyFile: k})
		if err != nil {
			t.Fatal(err)
		}
		cc, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return cc
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	gateway, worker, stranger := conn("gw", "spiffe://test/gateway"), conn("w", "spiffe://test/jobs/w1"), conn("s", "spiffe://test/stranger")
	ask := func(cc *grpc.ClientConn) error {
		_, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "bench",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "a"}}}}})
		return err
	}
	reserve := func(cc *grpc.ClientConn) error {
		_, err := charonv1.NewCharonClient(cc).Reserve(ctx, &charonv1.ReserveRequest{Copies: 1000, Session: "s",
			Resource: &charonv1.Resource{Domain: "bench", Entries: []*charonv1.Entry{{Key: "seat", Value: "x"}}}})
		return err
	}
	if err := ask(gateway); err != nil {
		t.Errorf("gateway ShouldRateLimit: %v", err)
	}
	if err := reserve(gateway); status.Code(err) != codes.PermissionDenied {
		t.Errorf("gateway Reserve: %v, want PermissionDenied", err)
	}
	if err := reserve(stranger); status.Code(err) != codes.PermissionDenied {
		t.Errorf("stranger Reserve: %v, want PermissionDenied", err)
	}
	if err := reserve(worker); err != nil {
		t.Errorf("worker Reserve: %v", err)
	}

	req, _ := http.NewRequest("GET", "http://"+p.debugAddr+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("/metrics without the token: %d, want 401", resp.StatusCode)
	}
	req.Header.Set("Authorization", "Bearer s3cret-token")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if n := metricValue(string(b), `charon_authz_denied_total{group="reserve"}`); n != 2 {
		t.Errorf("charon_authz_denied_total{group=reserve} = %v, want 2", n)
	}
	p.stop(t)
	if strings.Contains(p.stderr.String(), "s3cret-token") {
		t.Errorf("the debug token is in the log:\n%s", p.stderr.String())
	}
}

// TestServeRedisPasswordFile: the Redis password comes from a file and
// decisions go through a Redis that requires it; a password given in
// --redis-url is warned about and never printed, nor is one in a URL that
// does not parse.
func TestServeRedisPasswordFile(t *testing.T) {
	const pw = "s3cret-pw"
	r := redistest.SinglePassword(t, pw)
	dir := t.TempDir()
	bin := buildCharon(t)
	p := startServeEnv(t, bin, nil, "--config", writeRedisConfig(t), "--store", "redis",
		"--redis-url", "redis://"+r.Addr(), "--redis-password-file", writeFile(t, dir, "pw", pw+"\n"), "--failure-mode", "unavailable")
	for i := 0; i < 3; i++ {
		if !p.mustOK(t, "user", "pwfile") {
			t.Fatal("refused under the limit")
		}
	}
	m := get(t, "http://"+p.debugAddr+"/metrics")
	if n := metricValue(m, `charon_store_calls_total{path="unavailable"}`); n != 0 {
		t.Errorf("%v decisions failed over: the password from the file did not reach Redis", n)
	}
	p.stop(t)

	p = startServeEnv(t, bin, nil, "--config", writeRedisConfig(t), "--store", "redis",
		"--redis-url", "redis://:"+pw+"@"+r.Addr(), "--failure-mode", "unavailable")
	p.mustOK(t, "user", "argv")
	p.stop(t)
	if log := p.stderr.String(); strings.Contains(log, pw) || !strings.Contains(log, "--redis-password-file") {
		t.Errorf("a password in --redis-url: the log shows it or does not warn:\n%s", log)
	}

	var out, errb strings.Builder
	code := run([]string{"serve", "--store", "redis", "--redis-url", "user:" + pw + "@" + r.Addr()}, func(string) string { return "" }, &out, &errb)
	if code == 0 || strings.Contains(errb.String(), pw) || !strings.Contains(errb.String(), "--redis-url") {
		t.Errorf("a URL without a scheme: exit %d, stderr:\n%s", code, errb.String())
	}
}

// TestServeTLSWithLyftVariables starts `charon serve` with
// envoyproxy/ratelimit's TLS variables and a test CA: plaintext is refused,
// TLS with a client certificate is served (and `charon ask` works over it),
// and mutual TLS refuses a client without a certificate.
func TestServeTLSWithLyftVariables(t *testing.T) {
	m := tlstest.NewMutual(t, "charon.test", "envoy.test")
	ca, cert, key, clientCert, clientKey := m.CA, m.CertFile, m.KeyFile, m.ClientCertFile, m.ClientKeyFile
	p := startServeEnv(t, buildCharon(t), []string{"GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT=" + cert,
		"GRPC_SERVER_TLS_KEY=" + key, "GRPC_CLIENT_TLS_CACERT=" + ca.File, "GRPC_CLIENT_TLS_SAN=envoy.test"},
		"--config", "../../examples/config")
	check := func(opt grpc.DialOption) error {
		cc, err := grpc.NewClient(p.grpcAddr, opt)
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	tlsOpt := func(withCert bool) grpc.DialOption {
		o := tlsconfig.ClientOptions{CAFile: ca.File, ServerName: "charon.test"}
		if withCert {
			o.CertFile, o.KeyFile = clientCert, clientKey
		}
		c, err := tlsconfig.Client(o)
		if err != nil {
			t.Fatal(err)
		}
		return grpc.WithTransportCredentials(credentials.NewTLS(c))
	}
	if err := check(tlsOpt(true)); err != nil {
		t.Errorf("TLS with a client certificate: %v", err)
	}
	if err := check(grpc.WithTransportCredentials(insecure.NewCredentials())); err == nil {
		t.Error("plaintext accepted")
	}
	if err := check(tlsOpt(false)); err == nil {
		t.Error("a client without a certificate accepted under mutual TLS")
	}
	var out, errb strings.Builder
	args := []string{"ask", "--addr", p.grpcAddr, "--domain", "bench", "--descriptor", "user=alice",
		"--tls-ca", ca.File, "--tls-cert", clientCert, "--tls-key", clientKey, "--tls-server-name", "charon.test"}
	if code := run(args, os.Getenv, &out, &errb); code != 0 || !strings.Contains(out.String(), "OK") {
		t.Errorf("charon ask over mutual TLS: exit %d\n%s%s", code, out.String(), errb.String())
	}
}

// TestServeTLSFlagErrors: TLS flags that cannot work are refused at start,
// naming the flag or variable.
func TestServeTLSFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--grpc-tls-cert", "c.pem"}, nil, "--grpc-tls-key"},
		{[]string{"--http-tls"}, nil, "--grpc-tls-cert"},
		{[]string{"--grpc-tls-cert", "c", "--grpc-tls-key", "k", "--grpc-tls-client-san", "x"}, nil, "--grpc-tls-client-ca"},
		{nil, map[string]string{"GRPC_SERVER_USE_TLS": "true"}, "GRPC_SERVER_TLS_CERT"},
		{nil, map[string]string{"GRPC_SERVER_USE_TLS": "maybe"}, "GRPC_SERVER_USE_TLS"},
		{[]string{"--debug-tls"}, nil, "--grpc-tls-cert"},
		{[]string{"--authz", "a.yaml"}, nil, "--grpc-tls-client-ca"},
		{[]string{"--grpc-tls-cert", "c", "--grpc-tls-key", "k", "--authz", "a.yaml"}, nil, "--grpc-tls-client-ca"},
		{[]string{"--store", "redis", "--redis-url", "redis://h:1", "--redis-password-file", "/nonexistent/pw"}, nil, "--redis-password-file"},
	} {
		_, err := parseServe(tc.args, envOf(tc.env), new(strings.Builder))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v %v: %v, want an error naming %s", tc.args, tc.env, err, tc.want)
		}
	}
}

// TestServeRedisOverTLS: `charon serve` decides through a TLS-only Redis
// that requires client certificates, given envoyproxy/ratelimit's Redis TLS
// variables; every decision is Redis's.
func TestServeRedisOverTLS(t *testing.T) {
	m := tlstest.NewMutual(t, "redis.test", "charon.test")
	ca, cert, key, clientCert, clientKey := m.CA, m.CertFile, m.KeyFile, m.ClientCertFile, m.ClientKeyFile
	r := redistest.SingleTLS(t, cert, key, ca.File, true)
	p := startServeEnv(t, buildCharon(t), []string{"REDIS_TLS=true", "REDIS_TLS_CACERT=" + ca.File, "REDIS_TLS_CLIENT_CERT=" + clientCert,
		"REDIS_TLS_CLIENT_KEY=" + clientKey}, "--config", writeRedisConfig(t), "--store", "redis",
		"--redis-url", "rediss://"+r.Addr(), "--redis-tls-server-name", "redis.test", "--failure-mode", "unavailable")
	granted := 0
	for i := 0; i < testLimit+3; i++ {
		if p.mustOK(t, "user", "tls") {
			granted++
		}
	}
	if granted != testLimit {
		t.Errorf("%d of %d granted through Redis over TLS, want %d", granted, testLimit+3, testLimit)
	}
	metrics := get(t, "http://"+p.debugAddr+"/metrics")
	if n := metricValue(metrics, `charon_store_calls_total{path="unavailable"}`); n != 0 {
		t.Errorf("%v decisions failed over to the failure mode", n)
	}
}

// TestLyftRedisTLSFiles: envoyproxy/ratelimit's Redis TLS files turn TLS on
// only with REDIS_TLS=true; unset or false, it dials plain TCP, and so does
// Charon.
func TestLyftRedisTLSFiles(t *testing.T) {
	m := tlstest.NewMutual(t, "redis.test", "charon.test")
	for _, tc := range []struct {
		redisTLS string
		url      string
		tls      bool
	}{
		{"", "redis://h:1", false},
		{"false", "redis://h:1", false},
		{"0", "redis://h:1", false},
		{"true", "rediss://h:1", true},
	} {
		env := map[string]string{"REDIS_URL": "h:1", "REDIS_TLS": tc.redisTLS, "REDIS_TLS_CACERT": m.CA.File,
			"REDIS_TLS_CLIENT_CERT": m.ClientCertFile, "REDIS_TLS_CLIENT_KEY": m.ClientKeyFile,
			"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION": "true"}
		c, err := parseServe(nil, envOf(env), new(strings.Builder))
		if err != nil {
			t.Errorf("REDIS_TLS=%q: %v", tc.redisTLS, err)
			continue
		}
		o, err := c.Redis.Resolve()
		if err != nil {
			t.Errorf("REDIS_TLS=%q: %v", tc.redisTLS, err)
			continue
		}
		if c.Redis.URL != tc.url || (o.Conn.TLSConfig != nil) != tc.tls {
			t.Errorf("REDIS_TLS=%q: got URL %s, TLS %t; want %s, TLS %t", tc.redisTLS, c.Redis.URL, o.Conn.TLSConfig != nil, tc.url, tc.tls)
		}
	}
}

// TestServeRedisPasswordSources: the password comes from
// CHARON_REDIS_PASSWORD over REDIS_AUTH, and from --redis-password-file
// over both.
func TestServeRedisPasswordSources(t *testing.T) {
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"REDIS_AUTH": "lyft", "CHARON_REDIS_PASSWORD": "charon"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "charon"},
		{[]string{"--redis-password-file", pwFile}, "from-file"},
	} {
		c, err := parseServe(append([]string{"--store", "redis", "--redis-url", "redis://h:1"}, tc.args...), envOf(env), new(strings.Builder))
		if err != nil {
			t.Fatal(err)
		}
		o, err := c.Redis.Resolve()
		if err != nil || o.Conn.Password != tc.want {
			t.Errorf("%v: password %q, %v; want %q", tc.args, o.Conn.Password, err, tc.want)
		}
	}
}
