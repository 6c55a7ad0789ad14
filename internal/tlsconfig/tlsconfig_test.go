package tlsconfig_test

import (
	"crypto/tls"
	"errors"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/charonlimit/charon/internal/tlsconfig"
	"github.com/charonlimit/charon/internal/tlsconfig/tlstest"
)

// clock is a test clock moved by hand.
type clock struct{ ns atomic.Int64 }

func (c *clock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// handshake runs a TLS handshake between server config sc and client config
// cc over an in-memory connection; it returns the client's error, the
// server's, and the server certificate's common name the client saw.
func handshake(t *testing.T, sc, cc *tls.Config) (clientErr, serverErr error, served string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan error, 1)
	go func() {
		a, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer a.Close()
		_ = a.SetDeadline(time.Now().Add(30 * time.Second))
		s := tls.Server(a, sc)
		err = s.Handshake()
		if err == nil {
			// Read what the client writes after its handshake: a client
			// certificate the server refuses shows up here in TLS 1.3.
			buf := make([]byte, 1)
			_, err = s.Read(buf)
		}
		done <- err
		s.Close()
	}()
	b, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	_ = b.SetDeadline(time.Now().Add(30 * time.Second))
	c := tls.Client(b, cc)
	clientErr = c.Handshake()
	if clientErr == nil {
		served = c.ConnectionState().PeerCertificates[0].Subject.CommonName
		_, clientErr = c.Write([]byte{1})
		if clientErr == nil {
			buf := make([]byte, 1)
			// The server's alert if it refused us, else EOF when it
			// closes after reading our byte.
			if _, rerr := c.Read(buf); rerr != nil && !strings.Contains(rerr.Error(), "EOF") {
				clientErr = rerr
			}
		}
	}
	c.Close()
	serverErr = <-done
	return clientErr, serverErr, served
}

func TestServerRotation(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "ca")
	cert, key := ca.Issue(t, dir, "one.test")
	clk := &clock{}
	s, err := tlsconfig.NewServer(tlsconfig.Options{CertFile: cert, KeyFile: key, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := tlsconfig.Client(tlsconfig.ClientOptions{CAFile: ca.File, ServerName: "one.test"})
	if err != nil {
		t.Fatal(err)
	}
	if cerr, serr, got := handshake(t, s.Config(), cc); cerr != nil || serr != nil || got != "one.test" {
		t.Fatalf("first handshake: client %v, server %v, served %q", cerr, serr, got)
	}
	// A rotation writes a new certificate and key in place (renames).
	two, twoKey := ca.Issue(t, dir, "two.test")
	mustRename(t, two, cert)
	mustRename(t, twoKey, key)
	cc.ServerName = "two.test"
	if _, _, got := handshake(t, s.Config(), cc); got != "" {
		t.Fatalf("served %q before the check interval passed, want the old certificate (refused for two.test)", got)
	}
	clk.Advance(tlsconfig.DefaultCheckInterval)
	if cerr, serr, got := handshake(t, s.Config(), cc); cerr != nil || serr != nil || got != "two.test" {
		t.Fatalf("after the rotation: client %v, server %v, served %q; want two.test", cerr, serr, got)
	}
	// A half-written key keeps the last good pair.
	if err := os.WriteFile(key, []byte("-----BEGIN"), 0o600); err != nil {
		t.Fatal(err)
	}
	clk.Advance(tlsconfig.DefaultCheckInterval)
	if cerr, _, got := handshake(t, s.Config(), cc); cerr != nil || got != "two.test" {
		t.Fatalf("after a bad key file: client %v, served %q; want two.test still", cerr, got)
	}
	if s.Err() == nil || !strings.Contains(s.Err().Error(), key) {
		t.Errorf("Err() = %v, want the failed reload naming %s", s.Err(), key)
	}
}

func mustRename(t *testing.T, from, to string) {
	t.Helper()
	if err := os.Rename(from, to); err != nil {
		t.Fatal(err)
	}
}

func TestMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "ca")
	other := tlstest.NewCA(t, dir, "other")
	cert, key := ca.Issue(t, dir, "charon.test")
	envoyCert, envoyKey := ca.Issue(t, dir, "envoy.test", "spiffe-ish.test")
	strangerCert, strangerKey := ca.Issue(t, dir, "stranger.test")
	forgedCert, forgedKey := other.Issue(t, dir, "forged.test", "envoy.test")

	s, err := tlsconfig.NewServer(tlsconfig.Options{CertFile: cert, KeyFile: key, ClientCAFile: ca.File,
		AllowedSANs: []string{"envoy.test"}})
	if err != nil {
		t.Fatal(err)
	}
	client := func(certFile, keyFile string) *tls.Config {
		c, err := tlsconfig.Client(tlsconfig.ClientOptions{CAFile: ca.File, ServerName: "charon.test", CertFile: certFile, KeyFile: keyFile})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	for _, tc := range []struct {
		name      string
		cert, key string
		ok        bool
	}{
		{"allowed client", envoyCert, envoyKey, true},
		{"no certificate", "", "", false},
		{"signed, SAN not allowed", strangerCert, strangerKey, false},
		{"other CA", forgedCert, forgedKey, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cerr, serr, _ := handshake(t, s.Config(), client(tc.cert, tc.key))
			if ok := cerr == nil && serr == nil; ok != tc.ok {
				t.Errorf("client %v, server %v; want accepted %v", cerr, serr, tc.ok)
			}
			if tc.name == "signed, SAN not allowed" && !errors.Is(serr, tlsconfig.ErrSANNotAllowed) {
				t.Errorf("server error %v, want ErrSANNotAllowed", serr)
			}
		})
	}
}

func TestOptionErrors(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "ca")
	cert, key := ca.Issue(t, dir, "x.test")
	for _, tc := range []struct {
		name string
		opts tlsconfig.Options
		want string
	}{
		{"no key", tlsconfig.Options{CertFile: cert}, "both required"},
		{"missing file", tlsconfig.Options{CertFile: cert, KeyFile: dir + "/nope.key"}, "nope.key"},
		{"CA not PEM", tlsconfig.Options{CertFile: cert, KeyFile: key, ClientCAFile: key}, "no PEM certificate"},
		{"SANs without CA", tlsconfig.Options{CertFile: cert, KeyFile: key, AllowedSANs: []string{"a"}}, "need a client CA"},
	} {
		if _, err := tlsconfig.NewServer(tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
	if _, err := tlsconfig.Client(tlsconfig.ClientOptions{CertFile: cert}); err == nil {
		t.Error("client certificate without key accepted")
	}
}

// TestSkipHostname: SkipHostname accepts a server whose certificate the CA
// signed for another name, and still refuses one another CA signed; without
// it the name is checked, with InsecureSkipVerify nothing is.
func TestSkipHostname(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "ca")
	other := tlstest.NewCA(t, dir, "other")
	signed, signedKey := ca.Issue(t, dir, "redis.internal")
	forged, forgedKey := other.Issue(t, dir, "forged.internal", "redis.internal")
	for _, tc := range []struct {
		name       string
		cert, key  string
		opts       tlsconfig.ClientOptions
		acceptable bool
	}{
		{"name checked, other name", signed, signedKey, tlsconfig.ClientOptions{CAFile: ca.File, ServerName: "charon.test"}, false},
		{"skip hostname, other name", signed, signedKey, tlsconfig.ClientOptions{CAFile: ca.File, ServerName: "charon.test", SkipHostname: true}, true},
		{"skip hostname, other CA", forged, forgedKey, tlsconfig.ClientOptions{CAFile: ca.File, ServerName: "redis.internal", SkipHostname: true}, false},
		{"skip verify, other CA", forged, forgedKey, tlsconfig.ClientOptions{CAFile: ca.File, InsecureSkipVerify: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := tlsconfig.NewServer(tlsconfig.Options{CertFile: tc.cert, KeyFile: tc.key})
			if err != nil {
				t.Fatal(err)
			}
			cc, err := tlsconfig.Client(tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			cerr, serr, _ := handshake(t, s.Config(), cc)
			if ok := cerr == nil && serr == nil; ok != tc.acceptable {
				t.Errorf("client %v, server %v; want accepted %v", cerr, serr, tc.acceptable)
			}
		})
	}
}
