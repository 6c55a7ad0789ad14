package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/charonlimit/charon/internal/statefile"
)

// TestStateFileAcrossRestarts runs the binary with --state-file: a yearly
// quota's count survives a SIGTERM and a restart exactly; after a SIGKILL it
// keeps what the last periodic or SIGUSR1 snapshot held and loses at most
// the hits since; a corrupt file stops the start, naming the file, unless
// --state-file-discard-invalid.
func TestStateFileAcrossRestarts(t *testing.T) {
	bin := buildCharon(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config")
	if err := os.Mkdir(cfg, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, cfg, "plans.yaml", `domain: plans
descriptors:
  - key: tenant
    quota: {limit: 1000, period: year}
`)
	state := filepath.Join(dir, "charon.state")
	start := func(interval string, extra ...string) *proc {
		return startServe(t, bin, append([]string{"--config", cfg, "--state-file", state, "--state-interval", interval}, extra...)...)
	}
	ask := func(p *proc, n int) {
		for range n {
			if code := run([]string{"ask", "--addr", p.grpcAddr, "--domain", "plans", "--descriptor", "tenant=acme"}, os.Getenv, io.Discard, io.Discard); code != 0 {
				t.Fatalf("ask: exit %d", code)
			}
		}
	}
	used := func(p *proc) int64 {
		resp, err := http.Get("http://" + p.httpAddr + "/usage?domain=plans&descriptor=tenant=acme")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var u struct {
			Limits []struct {
				Kind string
				Used int64
			}
		}
		if err := json.NewDecoder(resp.Body).Decode(&u); err != nil || len(u.Limits) != 1 || u.Limits[0].Kind != "quota" {
			t.Fatalf("GET /usage: %+v, %v", u, err)
		}
		return u.Limits[0].Used
	}
	// snapshotAfter waits, with a deadline, for a snapshot written after
	// the instant t.
	snapshotAfter := func(p *proc, t0 time.Time) {
		deadline := time.Now().Add(20 * time.Second)
		for {
			if _, written, err := statefile.Read(state); err == nil && written > t0.UnixMicro() {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("no snapshot after %v in 20s\n%s", t0, p.stderr.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	kill := func(p *proc) {
		p.cmd.Process.Kill()
		<-p.exited
	}

	// SIGTERM: the last snapshot holds every hit.
	p := start("1h")
	ask(p, 5)
	p.stop(t)
	p = start("1h")
	if got := used(p); got != 5 {
		t.Fatalf("after SIGTERM and a restart: %d used, want 5", got)
	}

	// SIGUSR1: a snapshot at once, which a SIGKILL keeps.
	ask(p, 2)
	asked := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	snapshotAfter(p, asked)
	if m := get(t, "http://"+p.debugAddr+"/metrics"); !strings.Contains(m, `charon_state_file_writes_total{outcome="written"}`) ||
		!strings.Contains(m, `charon_state_file_writes_total{outcome="failed"} 0`) {
		t.Errorf("/metrics lacks the state file's writes:\n%s", m)
	}
	kill(p)
	p = start("100ms")
	if got := used(p); got != 7 {
		t.Fatalf("after SIGUSR1, SIGKILL and a restart: %d used, want 7", got)
	}

	// SIGKILL with a short interval: what the last periodic snapshot held
	// is kept; at most the hits after it are lost.
	ask(p, 3)
	snapshotAfter(p, time.Now())
	ask(p, 4)
	kill(p)
	p = start("100ms")
	if got := used(p); got < 10 || got > 14 {
		t.Fatalf("after SIGKILL and a restart: %d used, want 10 (the periodic snapshot) to 14", got)
	}
	p.stop(t)

	// A corrupt file stops the start, naming it; told to, charon starts
	// empty.
	b, err := os.ReadFile(state)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(state, b[:len(b)-3], 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "serve", "--config", cfg, "--state-file", state, "--grpc-addr", "127.0.0.1:0",
		"--http-addr", "127.0.0.1:0", "--debug-addr", "127.0.0.1:0").CombinedOutput()
	if err == nil || !strings.Contains(string(out), state) || !strings.Contains(string(out), "corrupt") {
		t.Fatalf("serve with a truncated state file: %v\n%s", err, out)
	}
	// A state file that could never be written stops the start too, naming
	// its missing directory: serving would lose every count at the next
	// restart.
	missing := filepath.Join(filepath.Dir(state), "not-mounted", "state")
	out, err = exec.Command(bin, "serve", "--config", cfg, "--state-file", missing, "--grpc-addr", "127.0.0.1:0",
		"--http-addr", "127.0.0.1:0", "--debug-addr", "127.0.0.1:0").CombinedOutput()
	if err == nil || !strings.Contains(string(out), missing) || !strings.Contains(string(out), "does not exist") {
		t.Fatalf("serve with --state-file in a missing directory: %v\n%s", err, out)
	}
	p = start("1h", "--state-file-discard-invalid")
	if got := used(p); got != 0 {
		t.Errorf("discarding an invalid file: %d used, want 0", got)
	}
	if !strings.Contains(p.stderr.String(), "invalid") {
		t.Errorf("no warning about the discarded file:\n%s", p.stderr.String())
	}
	p.stop(t)
}
