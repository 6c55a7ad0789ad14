package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestCandidateConfigProcess: charon serve --candidate-config decides in
// shadow, counts on GET /candidate, reloads the candidate when its files
// change, and charon explain --candidate shows both configurations.
func TestCandidateConfigProcess(t *testing.T) {
	bin := buildCharon(t)
	live := writeConfig(t, map[string]string{"api.yaml": "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"})
	candText := "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: %d}\n"
	cand := writeConfig(t, map[string]string{"api.yaml": fmt.Sprintf(candText, 1)})
	p := startServe(t, bin, "--config", live, "--candidate-config", cand)
	for range 3 {
		resp, err := p.rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "alice"}}}}})
		if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("answer %v, %v: want OK (the live limit)", resp, err)
		}
	}
	// The candidate decides off the request path: wait for its counts.
	body := httpGet(t, "http://"+p.debugAddr+"/candidate")
	for deadline := time.Now().Add(20 * time.Second); !strings.Contains(body, `"would_reject": 2`) || !strings.Contains(body, `"agree": 1`); body = httpGet(t, "http://"+p.debugAddr+"/candidate") {
		if time.Now().After(deadline) {
			t.Fatalf("/candidate: %s", body)
		}
		time.Sleep(10 * time.Millisecond)
	}
	explain := func() string {
		var out, errb bytes.Buffer
		if code := run([]string{"explain", "--addr", p.grpcAddr, "--domain", "api", "--descriptor", "user=alice", "--candidate"}, os.Getenv, &out, &errb); code != 0 {
			t.Fatalf("charon explain --candidate: exit %d: %s", code, errb.String())
		}
		return out.String()
	}
	if out := explain(); !strings.Contains(out, "under the candidate configuration:") || !strings.Contains(out, "5 per 1m") || !strings.Contains(out, "1 per 1m") {
		t.Errorf("charon explain --candidate:\n%s", out)
	}
	if err := os.WriteFile(filepath.Join(cand, "api.yaml"), []byte(fmt.Sprintf(candText, 10)), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(explain(), "10 per 1m") {
		if time.Now().After(deadline) {
			t.Fatalf("the candidate was not reloaded:\n%s", explain())
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.stop(t)
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
