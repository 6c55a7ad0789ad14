package config

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"testing/fstest"
	"time"
)

// bigFS is 1,000 files of 100 descriptors each.
func bigFS() fstest.MapFS {
	fsys := fstest.MapFS{}
	for f := 0; f < 1000; f++ {
		var b strings.Builder
		fmt.Fprintf(&b, "domain: d%d\ndescriptors:\n", f)
		for d := 0; d < 100; d++ {
			switch d % 3 {
			case 0:
				fmt.Fprintf(&b, "  - key: k%d\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", d, d+1)
			case 1:
				fmt.Fprintf(&b, "  - key: k%d\n    value: v%d\n    tiers:\n      - {limit: 5, window: 1s}\n      - {limit: 20, window: 1s, active: 5s, cooldown: 15s}\n", d, d)
			default:
				fmt.Fprintf(&b, "  - key: k%d\n    descriptors:\n      - key: user\n        token_bucket: {capacity: 100, refill: 1, per: 1s}\n", d)
			}
		}
		fsys[fmt.Sprintf("f%04d.yaml", f)] = &fstest.MapFile{Data: []byte(b.String())}
	}
	return fsys
}

// TestLoadSpeed logs how long loading bigFS takes, wall and CPU time. It is
// opt-in and asserts nothing about timing (the machine may be shared); the
// README carries the figure.
func TestLoadSpeed(t *testing.T) {
	if os.Getenv("CHARON_LOAD_SPEED") == "" {
		t.Skip("set CHARON_LOAD_SPEED=1 to time loading 1,000 files × 100 descriptors")
	}
	fsys := bigFS()
	cpu0 := cpuTime()
	start := time.Now()
	_, _, err := Load(fsys, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("1,000 files × 100 descriptors loaded in %v wall, %v CPU (all threads, GC included)", time.Since(start), cpuTime()-cpu0)
}

func BenchmarkLoad1000x100(b *testing.B) {
	fsys := bigFS()
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := Load(fsys, Options{}); err != nil {
			b.Fatal(err)
		}
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
