package main

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/charonlimit/charon/copylog"
	"github.com/charonlimit/charon/internal/redistest"
	"github.com/charonlimit/charon/server"
)

// TestRedisCopyMetrics: with --store redis the copies-held gauge and the
// copy store's gauges follow the reaper's sweeps of the Redis, and the
// holds a sweep reaps are counted.
func TestRedisCopyMetrics(t *testing.T) {
	n := redistest.Single(t)
	c := defaultServeConfig()
	c.Store, c.RedisURL = "redis", "redis://"+n.Addr()
	cs, err := openCopies(c, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	r := cs.(*redisCopies)
	m := server.NewMetrics(nil)
	o := charonOptions(cs, m)

	ctx := context.Background()
	cfg := &copylog.Config{DomainLimit: 10}
	for _, h := range []struct {
		id    string
		lease time.Duration
	}{{"short", 2 * time.Second}, {"long", time.Minute}} {
		res, err := cs.Reserve(ctx, time.Now(), "seat", cfg, copylog.ReserveRequest{Domain: "d", Copies: 3, HoldID: h.id, Lease: h.lease})
		if err != nil || !res.OK {
			t.Fatalf("reserve %s: %+v %v", h.id, res, err)
		}
	}
	if err := r.sweep(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	if got := o.Holds(); got != 6 {
		t.Fatalf("copies held after a sweep = %v, want 6", got)
	}
	// The short lease lapses by Redis time; a sweep reaps it.
	deadline := time.Now().Add(60 * time.Second)
	for {
		if err := r.sweep(ctx, time.Now()); err != nil {
			t.Fatal(err)
		}
		if o.Holds() == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("copies held %v 60 s after the short lease, want 3", o.Holds())
		}
		time.Sleep(50 * time.Millisecond)
	}
	for name, want := range map[string]float64{"charon_copystore_holds": 1, "charon_copystore_reaped_holds_total": 1} {
		if got, ok := gathered(t, m, name); !ok || got != want {
			t.Errorf("%s = %v (found %v), want %v", name, got, ok, want)
		}
	}
	if got, _ := gathered(t, m, "charon_copystore_sweeps_total"); got < 2 {
		t.Errorf("charon_copystore_sweeps_total = %v, want at least 2", got)
	}
}

// gathered is the value of the unlabelled gauge or counter name in m.
func gathered(t *testing.T, m *server.Metrics, name string) (float64, bool) {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name || len(f.GetMetric()) != 1 {
			continue
		}
		mt := f.GetMetric()[0]
		if g := mt.GetGauge(); g != nil {
			return g.GetValue(), true
		}
		if c := mt.GetCounter(); c != nil {
			return c.GetValue(), true
		}
	}
	return 0, false
}

// TestMemoryCopyMetrics: with --store memory the copy store's gauges read
// the memory store.
func TestMemoryCopyMetrics(t *testing.T) {
	cs, err := openCopies(defaultServeConfig(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	m := server.NewMetrics(nil)
	o := charonOptions(cs, m)
	res, err := cs.Reserve(context.Background(), time.Now(), "seat", &copylog.Config{DomainLimit: 10},
		copylog.ReserveRequest{Domain: "d", Copies: 4, HoldID: "h", Lease: time.Minute})
	if err != nil || !res.OK {
		t.Fatalf("reserve: %+v %v", res, err)
	}
	if got := o.Holds(); got != 4 {
		t.Errorf("copies held = %v, want 4", got)
	}
	for name, want := range map[string]float64{"charon_copystore_holds": 1, "charon_copystore_transfers": 0, "charon_copystore_lease_expiries_total": 0} {
		if got, ok := gathered(t, m, name); !ok || got != want {
			t.Errorf("%s = %v (found %v), want %v", name, got, ok, want)
		}
	}
}
