package memlimit_test

import (
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/charonlimit/charon/internal/memlimit"
	"github.com/google/go-cmp/cmp"
)

const mib = 1 << 20

// pct is percent of x, rounded down (x*percent fits an int64 in these tests).
func pct(x, percent int64) int64 { return x * percent / 100 }

// tree writes files (path relative to a new root: content) and returns the
// root.
func tree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for name, body := range files {
		p := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// v1Self is /proc/self/cgroup of a process in a cgroup v1 (hybrid) layout,
// in the memory cgroup /pod/ctr.
const v1Self = "12:cpu,cpuacct:/pod/ctr\n4:memory:/pod/ctr\n0::/\n"

func TestContainer(t *testing.T) {
	for _, c := range []struct {
		name  string
		files map[string]string
		self  string
		want  uint64
	}{
		{"v2 namespaced: the container's cgroup at the root", map[string]string{"cgroup.controllers": "memory", "memory.max": "134217728\n"}, "0::/\n", 128 * mib},
		{"v2 no limit", map[string]string{"memory.max": "max\n"}, "0::/\n", 0},
		{"v2 no file (the host's root cgroup)", map[string]string{"cgroup.controllers": "memory"}, "0::/\n", 0},
		{"v2 own cgroup, the parent lower", map[string]string{"kubepods/memory.max": "268435456", "kubepods/pod1/memory.max": "max", "kubepods/pod1/ctr/memory.max": "536870912"}, "0::/kubepods/pod1/ctr\n", 256 * mib},
		{"v2 path not visible: the walk reaches the root", map[string]string{"memory.max": "67108864"}, "0::/kubepods/pod1/ctr\n", 64 * mib},
		{"v2 hybrid, unified mount", map[string]string{"unified/memory.max": "100000000"}, "0::/\n", 100000000},
		{"v1", map[string]string{"memory/pod/ctr/memory.limit_in_bytes": "209715200\n"}, v1Self, 200 * mib},
		{"v1 no limit (the page-aligned maximum)", map[string]string{"memory/memory.limit_in_bytes": "9223372036854771712\n", "memory/pod/ctr/memory.limit_in_bytes": "9223372036854771712\n"}, v1Self, 0},
		{"v1 the parent lower", map[string]string{"memory/pod/memory.limit_in_bytes": "104857600", "memory/pod/ctr/memory.limit_in_bytes": "209715200"}, v1Self, 100 * mib},
		{"v1 and v2 both: the least", map[string]string{"memory/memory.limit_in_bytes": "209715200", "memory.max": "104857600"}, v1Self, 100 * mib},
		{"v1 controller not listed for memory", map[string]string{"memory/memory.limit_in_bytes": "209715200"}, "3:cpu:/\n", 0},
		{"nothing mounted", nil, v1Self, 0},
		{"no /proc/self/cgroup", map[string]string{"memory.max": "104857600"}, "", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := memlimit.Container(tree(t, c.files), c.self)
			if err != nil || got != c.want {
				t.Errorf("Container = %d, %v; want %d", got, err, c.want)
			}
		})
	}
}

func TestContainerBadFile(t *testing.T) {
	root := tree(t, map[string]string{"memory.max": "lots\n"})
	_, err := memlimit.Container(root, "0::/\n")
	if err == nil || !strings.Contains(err.Error(), filepath.Join(root, "memory.max")) || !strings.Contains(err.Error(), `"lots"`) {
		t.Fatalf("Container with memory.max %q: err %v, want one naming the file and its content", "lots", err)
	}
}

func TestPlan(t *testing.T) {
	none := int64(math.MaxInt64)
	for _, c := range []struct {
		name      string
		container uint64
		goLimit   int64
		explicit  bool
		want      memlimit.Budget
		keysHeap  int64
	}{
		{"nothing known", 0, none, false,
			memlimit.Budget{GoLimit: none, GoLimitFrom: "none", FloorMiB: memlimit.UnlimitedFloorMiB}, 0},
		{"a 128 MiB container", 128 * mib, none, false,
			memlimit.Budget{Container: 128 * mib, GoLimit: pct(128*mib, 90), GoLimitFrom: "container", FloorMiB: 28}, pct(pct(128*mib, 90), 50)},
		{"a 512 MiB container: the chart's GOMEMLIMIT, 460MiB, is the same share", 512 * mib, none, false,
			memlimit.Budget{Container: 512 * mib, GoLimit: pct(512*mib, 90), GoLimitFrom: "container", FloorMiB: 115}, pct(pct(512*mib, 90), 50)},
		{"a large container: the floor is capped", 8 << 30, none, false,
			memlimit.Budget{Container: 8 << 30, GoLimit: pct(8<<30, 90), GoLimitFrom: "container", FloorMiB: memlimit.MostFloorMiB}, pct(pct(8<<30, 90), 50)},
		{"GOMEMLIMIT wins over the container", 512 * mib, 64 * mib, true,
			memlimit.Budget{Container: 512 * mib, GoLimit: 64 * mib, GoLimitFrom: "GOMEMLIMIT", FloorMiB: 16}, 32 * mib},
		{"GOMEMLIMIT without a container", 0, 200 * mib, true,
			memlimit.Budget{GoLimit: 200 * mib, GoLimitFrom: "GOMEMLIMIT", FloorMiB: 50}, 100 * mib},
		{"GOMEMLIMIT=off (explicit, no limit): the container's", 128 * mib, none, true,
			memlimit.Budget{Container: 128 * mib, GoLimit: pct(128*mib, 90), GoLimitFrom: "container", FloorMiB: 28}, pct(pct(128*mib, 90), 50)},
		{"a tiny container", 1 * mib, none, false,
			memlimit.Budget{Container: 1 * mib, GoLimit: pct(1*mib, 90), GoLimitFrom: "container", FloorMiB: 0}, pct(pct(1*mib, 90), 50)},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := memlimit.Plan(c.container, c.goLimit, c.explicit)
			if diff := cmp.Diff(c.want, b); diff != "" {
				t.Errorf("Plan(%d, %d, %v) (-want +got):\n%s", c.container, c.goLimit, c.explicit, diff)
			}
			if got := b.KeysHeap(); got != c.keysHeap {
				t.Errorf("KeysHeap = %d, want %d", got, c.keysHeap)
			}
			if b.Limited() && int64(b.FloorMiB)<<20 > b.GoLimit/4 {
				t.Errorf("floor %d MiB over a quarter of the soft limit %d", b.FloorMiB, b.GoLimit)
			}
		})
	}
}

// TestApply: a limit derived from the container is put in force; an explicit
// GOMEMLIMIT, or none, is left as it is.
func TestApply(t *testing.T) {
	old := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(old)
	memlimit.Plan(128*mib, math.MaxInt64, false).Apply()
	if got := debug.SetMemoryLimit(-1); got != pct(128*mib, 90) {
		t.Errorf("after Apply of a 128 MiB container's budget: limit %d, want %d", got, pct(128*mib, 90))
	}
	debug.SetMemoryLimit(300 * mib)
	memlimit.Plan(128*mib, 300*mib, true).Apply()
	memlimit.Plan(0, 300*mib, false).Apply()
	if got := debug.SetMemoryLimit(-1); got != 300*mib {
		t.Errorf("after Apply of an explicit or no limit: limit %d, want the 300 MiB in force", got)
	}
}
