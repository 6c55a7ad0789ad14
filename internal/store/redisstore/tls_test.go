package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/charonlimit/charon/internal/redisconn"
	"github.com/charonlimit/charon/internal/redistest"
	"github.com/charonlimit/charon/internal/store/storetest"
	"github.com/charonlimit/charon/internal/tlsconfig"
	"github.com/charonlimit/charon/internal/tlsconfig/tlstest"
)

// TestTLS decides through a redis-server that speaks only TLS, with a
// private CA and a client certificate (the server verifies client
// certificates); without the client certificate, or without trusting the
// CA, the store cannot reach it.
func TestTLS(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "ca")
	cert, key := ca.Issue(t, dir, "redis.test", "127.0.0.1")
	clientCert, clientKey := ca.Issue(t, dir, "charon.test")
	n := redistest.SingleTLS(t, cert, key, ca.File, true)

	open := func(o tlsconfig.ClientOptions) (*Store, error) {
		cfg, err := tlsconfig.Client(o)
		if err != nil {
			t.Fatal(err)
		}
		s := openStore(t, redisconn.Options{URL: "rediss://" + n.Addr(), TLSConfig: cfg, DialTimeout: 5 * time.Second}, Options{})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return s, s.Ping(ctx)
	}
	s, err := open(tlsconfig.ClientOptions{CAFile: ca.File, ServerName: "redis.test", CertFile: clientCert, KeyFile: clientKey})
	if err != nil {
		t.Fatalf("ping over TLS with a client certificate: %v", err)
	}
	for i := 0; i < 11; i++ {
		d := storetest.Decide(t, s, time.Time{}, item(lyft, "tls", "d", 1))[0]
		if want := i < 10; d.OK != want {
			t.Fatalf("decision %d over TLS: %+v, want OK %v", i, d, want)
		}
	}
	if _, err := open(tlsconfig.ClientOptions{CAFile: ca.File, ServerName: "redis.test"}); err == nil {
		t.Error("a client without a certificate reached a server that requires one")
	}
	if _, err := open(tlsconfig.ClientOptions{ServerName: "redis.test", CertFile: clientCert, KeyFile: clientKey}); err == nil {
		t.Error("a client that does not trust the private CA reached the server")
	}
}
