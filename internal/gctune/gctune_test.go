package gctune

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"
)

const mib = 1 << 20

func TestPercent(t *testing.T) {
	for _, c := range []struct {
		live, floor uint64
		base, want  int
	}{
		{8 * mib, 64 * mib, 100, 700},   // goal 8 + 56 = 64 MiB
		{8*mib + 1, 64 * mib, 100, 700}, // rounded up: the goal is never below the floor
		{16 * mib, 64 * mib, 400, 400},  // GOGC=400 already reaches it
		{40 * mib, 64 * mib, 100, 100},  // 60% would do; GOGC is the least
		{64 * mib, 64 * mib, 100, 100},  // at the floor
		{200 * mib, 64 * mib, 50, 50},   // above it: GOGC unchanged
		{1024, 64 * mib, 100, 10_000},   // capped
		{0, 64 * mib, 100, 100},         // before the first cycle
		{8 * mib, 64 * mib, -1, -1},     // GC off stays off
		{8 * mib, 0, 100, 100},          // no floor
	} {
		if got := Percent(c.live, c.floor, c.base); got != c.want {
			t.Errorf("Percent(%d, %d, %d) = %d, want %d", c.live, c.floor, c.base, got, c.want)
		}
		if p := Percent(c.live, c.floor, c.base); p > 0 && p < 10_000 && c.live > 0 && c.live+c.live*uint64(p)/100 < c.floor {
			t.Errorf("Percent(%d, %d, %d) = %d: goal %d below the floor", c.live, c.floor, c.base, p, c.live+c.live*uint64(p)/100)
		}
	}
}

func gogc() int64 {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64())
}

// TestFloor: after a collection the tuner has raised the percentage so that
// the heap goal reaches the floor, and keeps doing so cycle after cycle (the
// finalizer re-arms itself); Stop restores the percentage it found.
func TestFloor(t *testing.T) {
	old := debug.SetGCPercent(100)
	defer debug.SetGCPercent(old)
	tu := Floor(256 * mib)
	if tu == nil {
		t.Fatal("Floor returned nil with GOGC=100")
	}
	defer tu.Stop()
	for cycle := range 3 {
		before := tu.Percent()
		tu.percent.Store(-2) // a value adjust never sets: shows the finalizer ran
		runtime.GC()
		deadline := time.Now().Add(10 * time.Second)
		for tu.Percent() == -2 {
			if time.Now().After(deadline) {
				t.Fatalf("cycle %d: the tuner did not adjust after a collection", cycle)
			}
			runtime.Gosched()
		}
		if p := tu.Percent(); p <= 100 || gogc() != int64(p) {
			t.Fatalf("cycle %d: percent %d (before %d), runtime's %d; want above 100 and in force", cycle, p, before, gogc())
		}
	}
	tu.Stop()
	if g := gogc(); g != 100 {
		t.Fatalf("after Stop: GOGC %d, want 100", g)
	}
}

func TestFloorOff(t *testing.T) {
	old := debug.SetGCPercent(-1)
	defer debug.SetGCPercent(old)
	if tu := Floor(64 * mib); tu != nil {
		t.Fatal("Floor with GOGC=off returned a tuner")
	}
	if tu := Floor(0); tu != nil {
		t.Fatal("Floor(0) returned a tuner")
	}
	var tu *Tuner
	tu.Stop() // nil: no-op
}
