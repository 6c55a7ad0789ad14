package client_test

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
	"github.com/charonlimit/charon/client"
	"github.com/charonlimit/charon/internal/tlsconfig"
	"github.com/charonlimit/charon/internal/tlsconfig/tlstest"
)

// TestDialTLS: Options.TLS connects over mutual TLS to a server that
// requires a client certificate; without it the call fails.
func TestDialTLS(t *testing.T) {
	m := tlstest.NewMutual(t, "charon.test", "app.test")
	srvTLS, err := tlsconfig.NewServer(tlsconfig.Options{CertFile: m.CertFile, KeyFile: m.KeyFile, ClientCAFile: m.CA.File})
	if err != nil {
		t.Fatal(err)
	}
	f := newFake()
	f.copyLimit[copyKey] = 5
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(srvTLS.Config())))
	charonv1.RegisterCharonServer(srv, f)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	for _, withCert := range []bool{true, false} {
		o := tlsconfig.ClientOptions{CAFile: m.CA.File, ServerName: m.ServerName}
		if withCert {
			o.CertFile, o.KeyFile = m.ClientCertFile, m.ClientKeyFile
		}
		cfg, err := tlsconfig.Client(o)
		if err != nil {
			t.Fatal(err)
		}
		c, err := client.Dial(lis.Addr().String(), client.Options{TLS: cfg})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		h, err := c.Reserve(ctx, copyRes, 1, 1, 0)
		cancel()
		if withCert {
			if err != nil || !h.OK() {
				t.Errorf("reserve over mutual TLS: %v", err)
			} else {
				_ = h.Close()
			}
		} else if err == nil {
			t.Error("reserve without a client certificate succeeded under mutual TLS")
		}
		_ = c.Close()
	}
}
