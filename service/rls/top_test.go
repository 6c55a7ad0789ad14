package rls

import (
	"net/http"
	"testing"

	"github.com/charonlimit/charon/server"
)

// TestTopAuthorization: /top and /ui/ are debug reads: /top behind the
// token (the page's own files are not, see TestUIPublicAssets), and both,
// over mutual TLS with a table, allowed to read (or to the single endpoint
// /charon.debug/Top), refused to others.
func TestTopAuthorization(t *testing.T) {
	s, stop := newTestServer(t, withTop(Options{}, 0), server.Options{DebugToken: "t0ken"})
	for _, path := range []string{"/top", "/top?domain=x"} {
		for _, c := range []struct {
			token string
			want  int
		}{{"", http.StatusUnauthorized}, {"wrong", http.StatusUnauthorized}, {"t0ken", http.StatusOK}} {
			if body, code := fetch(t, "GET", "http://"+s.DebugAddr()+path, c.token, ""); code != c.want {
				t.Errorf("%s with token %q: %d %.80q, want %d", path, c.token, code, body, c.want)
			}
		}
	}
	stop()

	m, srvTLS := mutualTLS(t, "unused.test")
	table := parseTable(t, `
clients:
  - identity: spiffe://test/reader
    allow: [read]
  - identity: spiffe://test/top
    allow: [/charon.debug/Top]
  - identity: spiffe://test/gateway
    allow: [rls]
`)
	s, stop = newTestServer(t, withTop(Options{}, 0), server.Options{GRPCTLS: srvTLS, DebugTLS: srvTLS, Authz: table})
	defer stop()
	base := "https://" + s.DebugAddr()
	for _, c := range []struct {
		who, path string
		want      int
	}{
		{"reader", "/top", http.StatusOK},
		{"reader", "/ui/", http.StatusOK},
		{"top", "/top?domain=x", http.StatusOK},
		{"top", "/ui/ui.css", http.StatusOK},
		{"top", "/metrics", http.StatusForbidden},
		{"gateway", "/top", http.StatusForbidden},
		{"gateway", "/ui/", http.StatusForbidden},
	} {
		if body, code := fetchWith(t, httpsClient(t, m, "spiffe://test/"+c.who), "GET", base+c.path, "", ""); code != c.want {
			t.Errorf("%s GET %s: %d %.80q, want %d", c.who, c.path, code, body, c.want)
		}
	}
}
