package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/charonlimit/charon/internal/redistest"
	"github.com/charonlimit/charon/internal/tlsconfig"
	"github.com/charonlimit/charon/internal/tlsconfig/tlstest"
)

// TestServeTLSWithLyftVariables starts `charon serve` with
// envoyproxy/ratelimit's TLS variables and a test CA: plaintext is refused,
// TLS with a client certificate is served (and `charon ask` works over it),
// and mutual TLS refuses a client without a certificate.
func TestServeTLSWithLyftVariables(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the binary")
	}
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "ca")
	cert, key := ca.Issue(t, dir, "charon.test", "127.0.0.1")
	clientCert, clientKey := ca.Issue(t, dir, "envoy.test")
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
	if testing.Short() {
		t.Skip("runs the binary and redis-server")
	}
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "ca")
	cert, key := ca.Issue(t, dir, "redis.test", "127.0.0.1")
	clientCert, clientKey := ca.Issue(t, dir, "charon.test")
	r := redistest.SingleTLS(t, cert, key, ca.File, true)
	p := startServeEnv(t, buildCharon(t), []string{"REDIS_TLS_CACERT=" + ca.File, "REDIS_TLS_CLIENT_CERT=" + clientCert,
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
	m := get(t, "http://"+p.debugAddr+"/metrics")
	if n := metricValue(m, `charon_store_calls_total{path="unavailable"}`); n != 0 {
		t.Errorf("%v decisions failed over to the failure mode", n)
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
		if err != nil || o.Password != tc.want {
			t.Errorf("%v: password %q, %v; want %q", tc.args, o.Password, err, tc.want)
		}
	}
}
