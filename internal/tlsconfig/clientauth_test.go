package tlsconfig_test

import (
	"crypto/tls"
	"testing"

	"github.com/charonlimit/charon/internal/tlsconfig"
	"github.com/charonlimit/charon/internal/tlsconfig/tlstest"
)

// TestConfigClientAuth: the config Config returns says whether it verifies
// clients, as its handshakes do, so that a caller can check it (the debug
// port's POST /reset needs client certificates), not only
// GetConfigForClient's config.
func TestConfigClientAuth(t *testing.T) {
	m := tlstest.NewMutual(t, "charon.test", "client.test")
	for _, c := range []struct {
		name string
		opts tlsconfig.Options
		want tls.ClientAuthType
		sans bool
	}{
		{"no client CA", tlsconfig.Options{CertFile: m.CertFile, KeyFile: m.KeyFile}, tls.NoClientCert, false},
		{"client CA", tlsconfig.Options{CertFile: m.CertFile, KeyFile: m.KeyFile, ClientCAFile: m.CA.File}, tls.RequireAndVerifyClientCert, false},
		{"client CA and SANs", tlsconfig.Options{CertFile: m.CertFile, KeyFile: m.KeyFile, ClientCAFile: m.CA.File, AllowedSANs: []string{"client.test"}},
			tls.RequireAndVerifyClientCert, true},
	} {
		s, err := tlsconfig.NewServer(c.opts)
		if err != nil {
			t.Fatal(err)
		}
		cfg := s.Config()
		if cfg.ClientAuth != c.want {
			t.Errorf("%s: got ClientAuth %v, want %v", c.name, cfg.ClientAuth, c.want)
		}
		if got, want := cfg.ClientCAs != nil, c.want != tls.NoClientCert; got != want {
			t.Errorf("%s: got ClientCAs set %v, want %v", c.name, got, want)
		}
		if got := cfg.VerifyPeerCertificate != nil; got != c.sans {
			t.Errorf("%s: got VerifyPeerCertificate set %v, want %v", c.name, got, c.sans)
		}
		hc, err := cfg.GetConfigForClient(&tls.ClientHelloInfo{})
		if err != nil {
			t.Fatal(err)
		}
		if hc.ClientAuth != cfg.ClientAuth {
			t.Errorf("%s: handshakes' ClientAuth %v, top-level %v", c.name, hc.ClientAuth, cfg.ClientAuth)
		}
	}
}
