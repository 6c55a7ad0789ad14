package server

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
)

// healthOpen returns the HTTP port's TLS configuration: cfg's, except that
// where cfg requires a client certificate, one is asked for but not
// required at the handshake, so that a caller with none (the kubelet's
// probe) can reach /healthcheck. A certificate presented is verified as cfg
// verifies it (its chain, and the allowed SANs). required reports the
// change: the port's handler must then be wrapped in certRequired, which
// refuses every other path to a connection that presented none.
func healthOpen(cfg *tls.Config) (open *tls.Config, required bool) {
	if cfg == nil || cfg.ClientAuth != tls.RequireAndVerifyClientCert {
		return cfg, false
	}
	open = cfg.Clone()
	open.ClientAuth = tls.VerifyClientCertIfGiven
	open.VerifyPeerCertificate = ifGiven(cfg.VerifyPeerCertificate)
	if get := cfg.GetConfigForClient; get != nil {
		open.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			c, err := get(hello)
			if err != nil || c == nil || c.ClientAuth != tls.RequireAndVerifyClientCert {
				return c, err
			}
			c = c.Clone()
			c.ClientAuth = tls.VerifyClientCertIfGiven
			c.VerifyPeerCertificate = ifGiven(c.VerifyPeerCertificate)
			return c, nil
		}
	}
	return open, true
}

// ifGiven runs a peer check only on a certificate that was presented.
func ifGiven(f func([][]byte, [][]*x509.Certificate) error) func([][]byte, [][]*x509.Certificate) error {
	if f == nil {
		return nil
	}
	return func(raw [][]byte, chains [][]*x509.Certificate) error {
		if len(raw) == 0 {
			return nil
		}
		return f(raw, chains)
	}
}

// certRequired answers 403 to any request but /healthcheck on a connection
// that presented no verified client certificate (see healthOpen).
func certRequired(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthcheck" && (r.TLS == nil || len(r.TLS.VerifiedChains) == 0) {
			http.Error(w, "a client certificate is required", http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}
