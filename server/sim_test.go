package server

import (
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/internal/sim"
)

func TestSimulatorOnTheHTTPPort(t *testing.T) {
	s, stop := newTestServer(t, Options{})
	defer stop()
	body, code := get(t, "http://"+s.HTTPAddr()+"/sim/")
	if code != 200 || !strings.Contains(body, "Charon tier simulator") {
		t.Errorf("GET /sim/: %d %.80q", code, body)
	}
	resp, err := http.Get("http://" + s.HTTPAddr() + "/sim/charon.wasm")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	want := http.StatusNotFound
	if sim.Built() {
		want = 200
	}
	if resp.StatusCode != want || (want == 200 && resp.Header.Get("Content-Type") != "application/wasm") {
		t.Errorf("GET /sim/charon.wasm: %d %s, want %d", resp.StatusCode, resp.Header.Get("Content-Type"), want)
	}
}

// TestHTTPRootAndRLConfig: the HTTP port's root is a page linking the
// simulator and the health check (any other unknown path stays 404), and
// /rlconfig is YAML a browser shows: text/plain.
func TestHTTPRootAndRLConfig(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.yaml"), []byte("domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	load := func(fsys fs.FS) (*config.Config, []config.Warning, error) { return config.Load(fsys, config.Options{}) }
	s, stop := newTestServer(t, Options{ConfigDir: dir, Load: load})
	defer stop()
	for _, tc := range []struct {
		url, ctype string
		code       int
		has        []string
	}{
		{"http://" + s.HTTPAddr() + "/", "text/html; charset=utf-8", 200, []string{`href="sim/"`, `href="healthcheck"`, "POST /json"}},
		{"http://" + s.HTTPAddr() + "/nope", "", 404, nil},
		{"http://" + s.DebugAddr() + "/rlconfig", "text/plain; charset=utf-8", 200, []string{"domain: a"}},
	} {
		resp, err := http.Get(tc.url)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.code || (tc.ctype != "" && resp.Header.Get("Content-Type") != tc.ctype) {
			t.Errorf("GET %s: %d %q, want %d %q", tc.url, resp.StatusCode, resp.Header.Get("Content-Type"), tc.code, tc.ctype)
		}
		for _, h := range tc.has {
			if !strings.Contains(string(body), h) {
				t.Errorf("GET %s lacks %q:\n%s", tc.url, h, body)
			}
		}
	}
}
