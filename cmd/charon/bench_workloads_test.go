package main

import (
	"os"
	"strings"
	"testing"
)

// TestBenchWorkloads runs `charon bench` against `charon serve` on
// examples/config in the workloads make bench and make bench-redis measure:
// one descriptor over many users, the hot key limited to 100/s, and three
// descriptors per request with a deadline. Every request is answered, and
// the hot key is mostly over its limit.
func TestBenchWorkloads(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the binary")
	}
	p := startServe(t, buildCharon(t), "--config", "../../examples/config")
	for _, tc := range []struct {
		name string
		args []string
		over bool
	}{
		{"users", []string{"--key", "user", "--keys", "1000"}, false},
		{"hot", []string{"--key", "hot", "--hot"}, true},
		{"three", []string{"--three", "--keys", "1000", "--timeout", "10s"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb strings.Builder
			args := append([]string{"bench", "--addr", p.grpcAddr, "--domain", "bench", "--concurrency", "4",
				"--duration", "500ms", "--warmup", "100ms"}, tc.args...)
			if code := run(args, os.Getenv, &out, &errb); code != 0 {
				t.Fatalf("charon %s: exit %d\n%s%s", strings.Join(args, " "), code, out.String(), errb.String())
			}
			got := out.String()
			if !strings.Contains(got, "errors=0 ") || strings.Contains(got, " requests=0 ") {
				t.Fatalf("charon bench %s: %s", tc.name, got)
			}
			if over := !strings.Contains(got, "over_limit=0 "); over != tc.over {
				t.Errorf("charon bench %s: over-limit answers %v, want %v: %s", tc.name, over, tc.over, got)
			}
		})
	}
}
