package rls

import (
	"io/fs"
	"net/http"
)

// uiPublic is the set of debug port paths served without the debug token:
// the live page's own files, exactly as embedded ("/ui/" for its
// index.html), so that a browser, which cannot add a header to a
// navigation, can load the page and its login form; the page then sends
// the token on each of its own requests. The files are the same bytes for
// every client and hold no data: everything the page shows comes from
// /top and /explain, which keep requiring the token, as do every other
// path under /ui/ and every method but GET and HEAD. The authorization
// table, over DebugTLS, still applies to these paths.
var uiPublic = func() map[string]bool {
	public := map[string]bool{}
	// The page is one flat directory. Were it unreadable (it is compiled
	// in), nothing would be public: the token would guard the page too.
	files, _ := fs.ReadDir(uiFiles, "ui")
	for _, f := range files {
		switch {
		case f.IsDir():
		case f.Name() == "index.html":
			// http.FileServer answers index.html at its directory and
			// redirects the file's own name there.
			public["/ui/"] = true
		default:
			public["/ui/"+f.Name()] = true
		}
	}
	return public
}()

// uiPublicRequest reports whether r asks for one of the live page's files,
// which the debug token does not guard (see uiPublic).
func uiPublicRequest(r *http.Request) bool {
	return (r.Method == http.MethodGet || r.Method == http.MethodHead) && uiPublic[r.URL.Path]
}

// uiContentSecurity is the live page's Content-Security-Policy: its own
// files and requests to its own port only, no inline script, no framing
// (the login form cannot be overlaid by another site), and no form
// submission, so that a token typed in the form can never leave in a URL,
// even if the script failed to load.
const uiContentSecurity = "default-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// uiHeaders adds the live page's security headers to h's answers.
func uiHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", uiContentSecurity)
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Referrer-Policy", "no-referrer")
		h.ServeHTTP(w, r)
	})
}
