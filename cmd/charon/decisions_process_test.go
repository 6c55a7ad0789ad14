package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestDecisionLogToSuggest runs the loop an operator runs: serve with a
// decision log, send traffic, stop, propose limits from the log with
// charon suggest, and check the proposal with charon config check.
func TestDecisionLogToSuggest(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildCharon(t)
	dir := t.TempDir()
	logPath := filepath.Join(dir, "decisions.jsonl")
	var errb strings.Builder
	if code := run([]string{"serve", "--decision-log", logPath, "--decision-log-sample", "2"}, os.Getenv, &errb, &errb); code == 0 ||
		!strings.Contains(errb.String(), "--decision-log-sample") {
		t.Errorf("a sample of 2: exit %d, %q", code, errb.String())
	}
	p := startServe(t, bin, "--config", "../../examples/config", "--decision-log", logPath, "--decision-log-sample", "1")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 40 {
		user := "alice"
		if i%4 == 0 {
			user = "bob"
		}
		_, err := p.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: user}}},
		}})
		if err != nil {
			t.Fatal(err)
		}
	}
	p.stop(t)
	b, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n != 40 || !strings.Contains(string(b), `"result":"rejected"`) {
		t.Fatalf("the log has %d lines (want 40, rejections among them):\n%s", n, b)
	}
	out := filepath.Join(dir, "proposal")
	var stdout strings.Builder
	errb.Reset()
	if code := run([]string{"suggest", "--log", logPath, "--reject", "0", "--window", "1h", "--out", out}, os.Getenv, &stdout, &errb); code != 0 {
		t.Fatalf("charon suggest: exit %d: %s", code, errb.String())
	}
	proposal, err := os.ReadFile(filepath.Join(out, "api.yaml"))
	if err != nil || !strings.Contains(string(proposal), "limit: 30") {
		t.Errorf("proposal (want alice's 30 in an hour allowed):\n%s %v", proposal, err)
	}
	if code := run([]string{"config", "check", out}, os.Getenv, &stdout, &errb); code != 0 {
		t.Errorf("charon config check of the proposal: exit %d: %s", code, errb.String())
	}
}
