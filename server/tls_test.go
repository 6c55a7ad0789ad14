package server

import (
	"context"
	"crypto/tls"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/charonlimit/charon/internal/tlsconfig"
	"github.com/charonlimit/charon/internal/tlsconfig/tlstest"
)

// TestTLSPorts serves gRPC and HTTP over mutual TLS: a client with a
// certificate of the CA is served on both; a plaintext client and a TLS
// client without a certificate are refused.
func TestTLSPorts(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "ca")
	cert, key := ca.Issue(t, dir, "charon.test", "127.0.0.1")
	clientCert, clientKey := ca.Issue(t, dir, "envoy.test")
	srvTLS, err := tlsconfig.NewServer(tlsconfig.Options{CertFile: cert, KeyFile: key, ClientCAFile: ca.File})
	if err != nil {
		t.Fatal(err)
	}
	s, stop := newTestServer(t, Options{GRPCTLS: srvTLS.Config(), HTTPTLS: srvTLS.Config(), DebugTLS: srvTLS.Config()})
	defer stop()

	check := func(cc *grpc.ClientConn) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	tlsClient := func(withCert bool) *tls.Config {
		o := tlsconfig.ClientOptions{CAFile: ca.File, ServerName: "charon.test"}
		if withCert {
			o.CertFile, o.KeyFile = clientCert, clientKey
		}
		c, err := tlsconfig.Client(o)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	dialTLS := func(c *tls.Config) *grpc.ClientConn {
		cc, err := grpc.NewClient("passthrough:///"+s.GRPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(c)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return cc
	}
	if err := check(dialTLS(tlsClient(true))); err != nil {
		t.Errorf("gRPC with a client certificate: %v", err)
	}
	if err := check(dial(t, s.GRPCAddr())); err == nil {
		t.Error("plaintext gRPC accepted on a TLS port")
	}
	if err := check(dialTLS(tlsClient(false))); err == nil {
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
	if err := get(tlsClient(true)); err != nil {
		t.Errorf("HTTPS with a client certificate: %v", err)
	}
	if err := get(tlsClient(false)); err == nil {
		t.Error("HTTPS without a client certificate accepted under mutual TLS")
	}
	if err := getURL(tlsClient(true), "https://"+s.DebugAddr()+"/metrics"); err != nil {
		t.Errorf("debug port over mutual TLS: %v", err)
	}
	if err := getURL(tlsClient(false), "https://"+s.DebugAddr()+"/metrics"); err == nil {
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
