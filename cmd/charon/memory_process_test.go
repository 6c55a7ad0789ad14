package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// procStatus reads a kibibyte field of /proc/PID/status (VmRSS, VmHWM).
func procStatus(t *testing.T, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			var kib int64
			fmt.Sscan(v, &kib)
			return kib
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// TestMemoryUnderFlood floods `charon serve --max-keys 10000` with distinct
// values (charon bench, a million values drawn at random) until the server
// has allocated 768 MiB, three times the largest heap floor, and bounds its peak
// RSS: without a container limit (an empty CHARON_CGROUP_ROOT) at 160 MiB (a
// 256 MiB heap floor held 434 MiB), and in a 128 MiB container (a fake
// cgroup v2 tree) at the container's limit, with GOMEMLIMIT derived as 90%
// of it. The bounds are generous: the figures are in docs/performance.md.
func TestMemoryUnderFlood(t *testing.T) {
	bin := buildCharon(t)
	const mib = 1 << 20
	limited := t.TempDir()
	if err := os.WriteFile(filepath.Join(limited, "memory.max"), []byte("134217728\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name        string
		root        string
		bound       int64 // peak RSS, bytes
		wantLimit   float64
		wantInLog   string
		wantKeysLog string
	}{
		{"no container limit", t.TempDir(), 160 * mib, 0, "go_memory_limit_from=none heap_floor_mib=32", "max_keys=10000"},
		{"a 128 MiB container", limited, 128 * mib, 120795955, "go_memory_limit_from=container heap_floor_mib=28", "max_keys=10000"},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := []string{"GOMEMLIMIT=", "CHARON_CGROUP_ROOT=" + c.root} // GOMEMLIMIT: the test's own environment must not set it
			p := startServeEnv(t, bin, env, "--config", "../../examples/config", "--max-keys", "10000")
			if log := p.stderr.String(); !strings.Contains(log, c.wantInLog) || !strings.Contains(log, c.wantKeysLog) {
				t.Fatalf("start log lacks %q and %q:\n%s", c.wantInLog, c.wantKeysLog, log)
			}
			m := get(t, "http://"+p.debugAddr+"/metrics")
			if c.wantLimit != 0 {
				if got := metricValue(m, "go_gc_gomemlimit_bytes"); got != c.wantLimit {
					t.Fatalf("go_gc_gomemlimit_bytes %v, want %v", got, c.wantLimit)
				}
			}
			deadline := time.Now().Add(3 * time.Minute)
			var requests int
			for {
				out, err := exec.Command(bin, "bench", "--addr", p.grpcAddr, "--keys", "1000000", "--duration", "3s", "--concurrency", "32").CombinedOutput()
				if err != nil {
					t.Fatalf("charon bench: %v\n%s", err, out)
				}
				var n int
				for _, f := range strings.Fields(string(out)) {
					if v, ok := strings.CutPrefix(f, "requests="); ok {
						fmt.Sscan(v, &n)
					}
				}
				requests += n
				m = get(t, "http://"+p.debugAddr+"/metrics")
				if metricValue(m, "go_memstats_alloc_bytes_total") >= 768<<20 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the server allocated %v bytes in 3 minutes of flood, want 768 MiB", metricValue(m, "go_memstats_alloc_bytes_total"))
				}
			}
			peak, rss := procStatus(t, p.cmd.Process.Pid, "VmHWM")<<10, procStatus(t, p.cmd.Process.Pid, "VmRSS")<<10
			evicted := metricValue(m, "charon_store_evictions_total")
			t.Logf("reliability: --max-keys 10000 flooded with %d requests of new values, %s: RSS %d MiB, peak %d MiB, %v evictions",
				requests, c.name, rss/mib, peak/mib, evicted)
			if evicted == 0 {
				t.Error("no eviction: the flood did not fill --max-keys")
			}
			if peak > c.bound {
				t.Errorf("peak RSS %d MiB, want at most %d MiB", peak/mib, c.bound/mib)
			}
			p.stop(t)
		})
	}
}
