// Package gctune keeps the garbage collector's heap goal above a floor.
//
// Go's collector starts a cycle when the heap has grown by GOGC percent
// (100 by default) over the live heap. A rate limit server keeps a small
// live heap (a few MiB for tens of thousands of tracked pairs) and
// allocates a few KiB per gRPC call, so at 100 percent it collects dozens
// of times a second and spends a large share of its CPU, and its latency
// tail, on it. Floor raises the percentage while the live heap is small, so
// that the heap goal is at least the floor, and gives it back as the live
// heap grows: with a live heap above half the floor the configured GOGC
// applies unchanged. The cost is memory: up to the floor while the live
// heap is small, never more than GOGC allows above it.
//
// It adjusts after every cycle (a finalizer on a sentinel re-armed each
// cycle), reading the live heap from runtime/metrics. It does nothing when
// GOGC is off.
package gctune

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
)

// DefaultFloorMiB is charon bench's floor and the largest that charon serve
// derives from its memory limit (package memlimit), in MiB: a server with a
// small live heap collects once per 256 MiB allocated instead of once per
// few MiB. Marking the states of tracked pairs is most
// of a collection's work: with three descriptors per request over 10,000
// users, 256 MiB took the memory store from 0.57 to 0.72 of the no-op
// call's throughput (docs/performance.md).
const DefaultFloorMiB = 256

// Percent is the GOGC percentage that makes the heap goal at least floor
// bytes for a live heap of live bytes, and never less than base (the
// configured GOGC), capped at 10,000 percent.
func Percent(live, floor uint64, base int) int {
	const most = 10_000
	if base < 0 || live == 0 || floor <= live {
		return base
	}
	// goal = live + live*p/100 >= floor  <=>  p >= (floor-live)*100/live.
	p := (floor - live) * 100 / live
	if (floor-live)*100%live != 0 {
		p++
	}
	if p > most {
		p = most
	}
	return max(base, int(p))
}

// Tuner adjusts the GC percentage after each cycle; create it with Floor.
type Tuner struct {
	floor   uint64
	base    int
	stopped atomic.Bool
	once    sync.Once
	samples []metrics.Sample
	mu      sync.Mutex
	percent atomic.Int64
}

// Floor starts keeping the heap goal at least floor bytes, over the GC
// percentage in force (GOGC, or 100). It returns nil, doing nothing, when
// floor is 0 or the GC is off (GOGC=off). Stop restores the percentage.
func Floor(floor uint64) *Tuner {
	base := debug.SetGCPercent(100)
	debug.SetGCPercent(base)
	if floor == 0 || base < 0 {
		return nil
	}
	t := &Tuner{floor: floor, base: base, samples: []metrics.Sample{{Name: "/gc/heap/live:bytes"}}}
	t.percent.Store(int64(base))
	t.adjust()
	t.arm()
	return t
}

// sentinel is an object that dies in every GC cycle; its finalizer adjusts
// the percentage and makes the next one.
type sentinel struct {
	t *Tuner
	_ [16]byte // not a tiny allocation: tiny objects share blocks and may outlive a cycle
}

func (t *Tuner) arm() {
	s := &sentinel{t: t}
	runtime.SetFinalizer(s, func(s *sentinel) {
		if s.t.stopped.Load() {
			return
		}
		s.t.adjust()
		s.t.arm()
	})
}

func (t *Tuner) adjust() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped.Load() {
		return
	}
	metrics.Read(t.samples)
	var live uint64
	if v := t.samples[0].Value; v.Kind() == metrics.KindUint64 {
		live = v.Uint64()
	}
	p := Percent(live, t.floor, t.base)
	if int64(p) != t.percent.Load() {
		debug.SetGCPercent(p)
		t.percent.Store(int64(p))
	}
}

// Percent returns the GC percentage the tuner last set.
func (t *Tuner) Percent() int { return int(t.percent.Load()) }

// Stop stops adjusting and restores the GC percentage Floor found.
func (t *Tuner) Stop() {
	if t == nil {
		return
	}
	t.once.Do(func() {
		t.mu.Lock()
		t.stopped.Store(true)
		debug.SetGCPercent(t.base)
		t.mu.Unlock()
	})
}
