package rls

import (
	"io"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/internal/store/memstore"
)

// sfList matches a Structured Field list (RFC 9651) of strings with
// integer parameters, as the draft's two fields are.
var sfList = regexp.MustCompile(`^"(?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*"(?:;[a-z][a-z0-9_.*-]*=-?[0-9]{1,15})+` +
	`(?:, "(?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*"(?:;[a-z][a-z0-9_.*-]*=-?[0-9]{1,15})+)*$`)

// TestDraftHeaders: with DraftHeaders, an answer carries RateLimit-Policy
// and RateLimit as the IETF draft writes them: one policy per rule, named
// by the rule's name or else its resource, with its quota, window, what
// remains and when it grows; envoyproxy/ratelimit's headers are unchanged.
func TestDraftHeaders(t *testing.T) {
	const text = `domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3, name: per-user}
  - key: path
    value: /login
    rate_limit: {unit: second, requests_per_unit: 2}
`
	eng := engineFor(t, text, time.Date(2030, 6, 1, 21, 0, 0, 0, time.UTC))
	s := &Service{engine: eng, metrics: testMetrics(t), log: slog.New(slog.NewTextHandler(io.Discard, nil)), draftHeaders: true}
	headers := func() map[string]string {
		resp := ask(t, s, desc("user", "a\"b"), desc("path", "/login"), desc("user", "c"))
		hs := map[string]string{}
		for _, h := range resp.GetResponseHeadersToAdd() {
			hs[h.GetKey()] += h.GetValue()
		}
		return hs
	}
	ask(t, s, desc("user", "c")) // c has less left than a"b
	hs := headers()
	want := map[string]string{
		// Two users under one rule: the one with less left.
		HeaderDraftPolicy: `"per-user";q=3;w=60, "api/path=%2Flogin";q=2;w=1`,
		HeaderDraftLimit:  `"per-user";r=1;t=60, "api/path=%2Flogin";r=1;t=1`,
	}
	for k, v := range want {
		if hs[k] != v {
			t.Errorf("%s: %q, want %q", k, hs[k], v)
		}
		if !sfList.MatchString(hs[k]) {
			t.Errorf("%s: %q is not a Structured Field list of strings with integer parameters", k, hs[k])
		}
	}
	if _, ok := hs["RateLimit-Limit"]; ok {
		t.Error("RateLimit-Limit without --response-headers")
	}
	// Both headers together.
	s.responseHeaders, s.headerNames = true, defaultHeaderNames
	hs = headers()
	if hs["RateLimit-Limit"] == "" || !strings.Contains(hs[HeaderDraftLimit], `"per-user";r=`) {
		t.Errorf("with both: %v", hs)
	}
	// No limited status: no field.
	if resp := ask(t, s, desc("other", "x")); len(resp.GetResponseHeadersToAdd()) != 0 {
		t.Errorf("headers for an unlimited answer: %v", resp.GetResponseHeadersToAdd())
	}
}

// TestSFString: names are quoted and escaped, whatever bytes they hold.
func TestSFString(t *testing.T) {
	for in, want := range map[string]string{
		`plain`:       `"plain"`,
		`a"b\c`:       `"a\"b\\c"`,
		"tab\there":   `"tab%09here"`,
		"caf\xc3\xa9": `"caf%C3%A9"`,
	} {
		if got := sfString(in); got != want {
			t.Errorf("sfString(%q) = %s, want %s", in, got, want)
		}
	}
}

// engineFor is an engine on a memory store, with api.yaml of text as its
// configuration and its clock stopped at now.
func engineFor(t *testing.T, text string, now time.Time) *engine.Engine {
	t.Helper()
	cfg, _, err := config.Load(fstest.MapFS{"api.yaml": {Data: []byte(text)}}, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	st := memstore.New(memstore.Options{})
	t.Cleanup(func() { st.Close() })
	eng := engine.New(engine.Options{Store: st, Now: func() time.Time { return now }})
	eng.SetTree(cfg.Tree)
	return eng
}
