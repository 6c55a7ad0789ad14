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

	"github.com/charonlimit/charon/internal/statefile"
)

// countsConfig is 5 (then 6) requests an hour per user.
func countsConfig(n string) string {
	return "domain: web\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: " + n + "}\n"
}

// askCodes sends n requests for user alice to p and returns their codes.
func askCodes(t *testing.T, p *proc, n int) []rlsv3.RateLimitResponse_Code {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var codes []rlsv3.RateLimitResponse_Code
	for range n {
		resp, err := p.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "alice"}}},
		}})
		if err != nil {
			t.Fatalf("ShouldRateLimit: %v\n%s", err, p.stderr.String())
		}
		codes = append(codes, resp.OverallCode)
	}
	return codes
}

func wantAnswers(t *testing.T, what string, got []rlsv3.RateLimitResponse_Code, want ...rlsv3.RateLimitResponse_Code) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %v, want %v", what, got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%s: %v, want %v", what, got, want)
		}
	}
}

// reloadTo writes yaml over dir's file and waits, with a deadline, for
// the server to load it.
func reloadTo(t *testing.T, p *proc, dir, yaml string) {
	t.Helper()
	loads := func() float64 {
		return metricValue(get(t, "http://"+p.debugAddr+"/metrics"), `charon_config_reloads_total{result="success"}`)
	}
	before := loads()
	if err := os.WriteFile(filepath.Join(dir, "web.yaml"), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the reload", func() bool { return loads() > before })
}

// TestReloadRaisesLimitMidWindowEveryStore: with 5 requests of 5 an hour
// used, a reload raising the limit to 6 grants exactly one more within the
// hour, on the memory store, a single Redis and a Redis Cluster (SPEC §3:
// counts belong to the rule, not to its numbers).
func TestReloadRaisesLimitMidWindowEveryStore(t *testing.T) {
	bin := buildCharon(t)
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	for _, st := range everyStore() {
		t.Run(st.name, func(t *testing.T) {
			dir := writeConfigDir(t, "web.yaml", countsConfig("5"))
			p := startServe(t, bin, st.serveArgs(t, dir)...)
			wantAnswers(t, "5 of 5, then one more", askCodes(t, p, 6), ok, ok, ok, ok, ok, over)
			reloadTo(t, p, dir, countsConfig("6"))
			wantAnswers(t, "after raising the limit to 6", askCodes(t, p, 3), ok, over, over)
			reloadTo(t, p, dir, countsConfig("4"))
			wantAnswers(t, "after lowering it to 4", askCodes(t, p, 1), over)
			p.stop(t)
		})
	}
}

// TestStateFileKeepsCountAcrossLimitChange: with --state-file, 5 of 5 an
// hour used, a SIGTERM, the limit raised to 6 and a restart grant exactly
// one more. A state file an earlier version wrote (format 1) is an
// upgrade: the server starts with fresh counts, saying so.
func TestStateFileKeepsCountAcrossLimitChange(t *testing.T) {
	bin := buildCharon(t)
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	dir := writeConfigDir(t, "web.yaml", countsConfig("5"))
	state := filepath.Join(t.TempDir(), "charon.state")
	// A file of format 1, as an earlier version left it.
	old := statefile.Append(nil, time.Now().UnixMicro(), []statefile.Record{
		{Resource: "web/user", Domain: "alice", PolicyID: 42, Forget: statefile.Never, State: []int64{2, 1, 0, 5}},
	})
	old[len(statefile.Magic)] = 1
	if err := os.WriteFile(state, old, 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"--config", dir, "--state-file", state, "--state-interval", "1h"}
	p := startServe(t, bin, args...)
	if !strings.Contains(p.stderr.String(), "earlier version") {
		t.Errorf("no word of the earlier version's state file:\n%s", p.stderr.String())
	}
	wantAnswers(t, "5 of 5, then one more", askCodes(t, p, 6), ok, ok, ok, ok, ok, over)
	p.stop(t)
	if err := os.WriteFile(filepath.Join(dir, "web.yaml"), []byte(countsConfig("6")), 0o644); err != nil {
		t.Fatal(err)
	}
	p = startServe(t, bin, args...)
	wantAnswers(t, "restarted with the limit raised to 6", askCodes(t, p, 2), ok, over)
	p.stop(t)
}
