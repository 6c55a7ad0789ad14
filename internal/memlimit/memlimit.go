package memlimit

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/charonlimit/charon/internal/gctune"
)

// DefaultRoot is where Linux mounts the cgroup file systems.
const DefaultRoot = "/sys/fs/cgroup"

// noLimitV1 is where cgroup v1 starts reporting "no limit": it writes the
// largest page-aligned int64 (9223372036854771712), or more.
const noLimitV1 = math.MaxInt64 &^ (1<<30 - 1)

// Container returns the memory limit in bytes of the cgroup a process is in,
// 0 when none is set. root is where the cgroup file systems are mounted
// (DefaultRoot; a test points it at a directory of its own) and self the
// content of the process's /proc/self/cgroup. The cgroup v2 hierarchy is
// read at root (or at root/unified, a hybrid layout), the v1 memory
// controller at root/memory: at each, the process's cgroup and every
// ancestor down to the mount's root, and the least limit found wins. A
// cgroup whose directory is missing (a container that sees its own cgroup at
// the mount's root, whatever /proc/self/cgroup names) is skipped, so the
// walk reaches what the container can see. Only a limit file that exists
// but cannot be read or parsed is an error.
func Container(root, self string) (uint64, error) {
	var least uint64
	keep := func(n uint64) {
		if n > 0 && (least == 0 || n < least) {
			least = n
		}
	}
	sc := bufio.NewScanner(strings.NewReader(self))
	for sc.Scan() {
		// hierarchy-ID:controller-list:cgroup-path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 || !strings.HasPrefix(parts[2], "/") {
			continue
		}
		var dirs []string
		var file string
		switch {
		case parts[0] == "0" && parts[1] == "":
			dirs, file = []string{root, filepath.Join(root, "unified")}, "memory.max"
		case hasController(parts[1], "memory"):
			dirs, file = []string{filepath.Join(root, "memory")}, "memory.limit_in_bytes"
		default:
			continue
		}
		for _, dir := range dirs {
			n, err := walk(dir, parts[2], file)
			if err != nil {
				return 0, err
			}
			keep(n)
		}
	}
	return least, sc.Err()
}

func hasController(list, name string) bool {
	for c := range strings.SplitSeq(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// walk returns the least limit in file of the cgroup at p under mount and
// of its ancestors, 0 for none.
func walk(mount, p, file string) (uint64, error) {
	var least uint64
	for p = path.Clean(p); ; p = path.Dir(p) {
		name := filepath.Join(mount, filepath.FromSlash(p), file)
		n, err := readLimit(name)
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			return 0, err
		case n > 0 && (least == 0 || n < least):
			least = n
		}
		if p == "/" {
			return least, nil
		}
	}
}

// readLimit reads one limit file: a number of bytes, "max" (v2) or a
// number at or past noLimitV1 (v1) meaning none (0).
func readLimit(name string) (uint64, error) {
	b, err := os.ReadFile(name)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 0, nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("memlimit: %s: %q is not a number of bytes", name, s)
	}
	if n >= noLimitV1 {
		return 0, nil
	}
	return n, nil
}

// Shares of the memory limit, in percent.
const (
	// GoLimitPercent is the share of a container's limit given to the Go
	// runtime as its soft limit; the rest is for what the runtime does not
	// count (the binary's pages, C allocations) and a margin. The Helm chart
	// sets GOMEMLIMIT to the same share of resources.limits.memory.
	GoLimitPercent = 90
	// FloorPercent is the share of the soft limit the heap floor may take:
	// a quarter, so that the garbage the floor lets pile up, the live heap
	// and what the runtime holds beside the heap (stacks, pages not yet
	// returned) stay under the limit together. Under a flood of new values
	// in a 128 MiB container, a floor of half the soft limit peaked at 123
	// MiB of RSS, a quarter at 78 MiB, at the same throughput
	// (docs/performance.md).
	FloorPercent = 25
	// KeysPercent is the share of the soft limit the tracked pairs of the
	// memory store may take at most (package memstore sizes --max-keys
	// from it).
	KeysPercent = 50
)

// Floors of the garbage collector's heap, in MiB.
const (
	// MostFloorMiB is the floor when the memory is plentiful, gctune's
	// default.
	MostFloorMiB = gctune.DefaultFloorMiB
	// UnlimitedFloorMiB is the floor when no limit is known (no container
	// limit, no GOMEMLIMIT): small enough that a flood of new values holds
	// the process under about 100 MiB, large enough that a small live heap
	// is not collected at every few MiB (docs/performance.md).
	UnlimitedFloorMiB = 32
)

// Budget is what a process may spend, derived by Plan. The zero value means
// no limit and no floor.
type Budget struct {
	// Container is the container's limit in bytes, 0 if none.
	Container uint64
	// GoLimit is the runtime's soft limit in bytes (GOMEMLIMIT);
	// math.MaxInt64 means none.
	GoLimit int64
	// GoLimitFrom says where GoLimit came from: "GOMEMLIMIT", "container"
	// or "none".
	GoLimitFrom string
	// FloorMiB is the heap floor for gctune.Floor, in MiB.
	FloorMiB int
}

// Plan derives a budget from the container's limit (0: none) and the
// runtime's soft limit in force, goLimit (debug.SetMemoryLimit(-1)),
// explicit when the operator set GOMEMLIMIT. An explicit limit wins; else
// GoLimitPercent of the container's; else none. The heap floor is
// FloorPercent of the soft limit, at most MostFloorMiB, and
// UnlimitedFloorMiB without one.
func Plan(container uint64, goLimit int64, explicit bool) Budget {
	b := Budget{Container: container, GoLimit: math.MaxInt64, GoLimitFrom: "none"}
	switch {
	case explicit && goLimit > 0 && goLimit < math.MaxInt64:
		b.GoLimit, b.GoLimitFrom = goLimit, "GOMEMLIMIT"
	case container > 0:
		b.GoLimit, b.GoLimitFrom = int64(min(share(container, GoLimitPercent), math.MaxInt64)), "container"
	}
	if !b.Limited() {
		b.FloorMiB = UnlimitedFloorMiB
		return b
	}
	b.FloorMiB = int(min(share(uint64(b.GoLimit), FloorPercent)>>20, MostFloorMiB))
	return b
}

// Limited reports whether the budget has a soft limit.
func (b Budget) Limited() bool { return b.GoLimit > 0 && b.GoLimit < math.MaxInt64 }

// KeysHeap is the heap, in bytes, the memory store's tracked pairs may take:
// KeysPercent of the soft limit, 0 without one (the store's own default).
func (b Budget) KeysHeap() int64 {
	if !b.Limited() {
		return 0
	}
	return int64(share(uint64(b.GoLimit), KeysPercent))
}

// share is percent of x, rounded down, without overflow.
func share(x, percent uint64) uint64 { return x/100*percent + x%100*percent/100 }

// Apply sets the runtime's soft limit when it was derived from the
// container (an explicit GOMEMLIMIT is in force already).
func (b Budget) Apply() {
	if b.GoLimitFrom == "container" {
		debug.SetMemoryLimit(b.GoLimit)
	}
}
