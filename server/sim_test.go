package server

import (
	"net/http"
	"strings"
	"testing"

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
