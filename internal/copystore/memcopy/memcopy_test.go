package memcopy_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/charonlimit/charon/copylog"

	"github.com/charonlimit/charon/internal/copystore"
	"github.com/charonlimit/charon/internal/copystore/copystoretest"
	"github.com/charonlimit/charon/internal/copystore/memcopy"
)

var (
	t0  = copystoretest.T0
	cfg = &copylog.Config{DomainLimit: 5, GlobalLimit: 8}
	bg  = context.Background()
)

func at(d time.Duration) time.Time { return t0.Add(d) }

var idSeq int

func id(kind string) string {
	idSeq++
	return fmt.Sprintf("%s%d", kind, idSeq)
}

func TestConformance(t *testing.T) {
	for _, shards := range []int{0, 1} {
		t.Run("shards="+strconv.Itoa(shards), func(t *testing.T) {
			copystoretest.Run(t, func(*testing.T) copystore.Store { return memcopy.New(memcopy.Options{Shards: shards}) })
		})
	}
}

func reserve(t *testing.T, s *memcopy.Store, now time.Time, res, domain, session string, copies int64, lease time.Duration) copylog.Reservation {
	t.Helper()
	r, err := s.Reserve(bg, now, res, cfg, copylog.ReserveRequest{Domain: domain, Copies: copies, Min: 1, HoldID: id("h"), Session: session, Lease: lease})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestStats(t *testing.T) {
	s := memcopy.New(memcopy.Options{Shards: 4})
	defer s.Close()
	h1 := reserve(t, s, t0, "r1", "a", "s1", 3, time.Minute)
	reserve(t, s, t0, "r1", "a", "s1", 2, time.Minute)
	reserve(t, s, t0, "r1", "a", "", 1, time.Minute) // rejected: a holds 5
	h3 := reserve(t, s, t0, "r2", "b", "", 4, 10*time.Second)
	reserve(t, s, t0, "r2", "c", "", 1, 20*time.Second)
	x, err := s.Transfer(bg, t0, "r1", h1.HoldID, 1, 10*time.Second, id("x"))
	if err != nil {
		t.Fatal(err)
	}
	x2, err := s.Transfer(bg, t0, "r1", h1.HoldID, 1, time.Minute, id("x"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Seize(bg, t0, "r1", x2.TransferID, id("h"), "s2", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Release(bg, t0, "r2", h3.HoldID, 1); err != nil {
		t.Fatal(err)
	}
	want := memcopy.Stats{Resources: 2, Holds: 5, Transfers: 1, Copies: 9, Granted: 4, Rejected: 1, Seized: 1}
	if diff := cmp.Diff(want, s.Stats()); diff != "" {
		t.Fatalf("Stats (-want +got):\n%s", diff)
	}
	// Session s1 ends: its two holds, 1 + 2 copies (h1 gave 2 away).
	if _, err := s.ReleaseSession(bg, t0, "r1", "s1"); err != nil {
		t.Fatal(err)
	}
	// At T0+10s the transfer x lapses (reaped by an operation on r1)...
	if _, err := s.Seize(bg, at(10*time.Second), "r1", x.TransferID, id("h"), "", time.Minute); err == nil {
		t.Fatal("seize of a lapsed transfer succeeded")
	}
	// ...and h3 (3 copies) by the reaper; at T0+20s, c's hold.
	if err := s.Reap(bg, at(10*time.Second)); err != nil {
		t.Fatal(err)
	}
	want = memcopy.Stats{Resources: 2, Holds: 2, Copies: 2, Granted: 4, Rejected: 1, Seized: 1,
		LeaseExpiries: 1, ReapedHolds: 1, TransferExpiries: 1, ExpiredCopies: 4, SessionHolds: 2, SessionCopies: 3}
	if diff := cmp.Diff(want, s.Stats()); diff != "" {
		t.Fatalf("Stats after expiries (-want +got):\n%s", diff)
	}
	if err := s.Reap(bg, at(time.Hour)); err != nil {
		t.Fatal(err)
	}
	want = memcopy.Stats{Granted: 4, Rejected: 1, Seized: 1,
		LeaseExpiries: 3, ReapedHolds: 3, TransferExpiries: 1, ExpiredCopies: 6, SessionHolds: 2, SessionCopies: 3}
	if diff := cmp.Diff(want, s.Stats()); diff != "" {
		t.Fatalf("Stats after everything lapsed (-want +got):\n%s", diff)
	}
	if got := s.Tokens(); got != 2 {
		t.Errorf("Tokens() = %d, want 2 (both resources dropped)", got)
	}
}

func TestEmptyCopyLogDroppedByReapTokenKept(t *testing.T) {
	s := memcopy.New(memcopy.Options{})
	defer s.Close()
	// Neither errors nor rejections on a resource store anything.
	if _, err := s.Release(bg, t0, "r", "nope", 0); err == nil {
		t.Fatal("release of an unknown hold succeeded")
	}
	reserve(t, s, t0, "r", "a", "", 1, time.Minute)
	st := s.Stats()
	if st.Resources != 1 || s.Tokens() != 0 {
		t.Fatalf("after one grant: %d resources, %d tokens", st.Resources, s.Tokens())
	}
	if _, err := s.ReleaseSession(bg, t0, "other", "s"); err != nil {
		t.Fatal(err)
	}
	if n := s.Stats().Resources; n != 1 {
		t.Fatalf("%d resources, want 1", n)
	}
	var tok int64
	for i := range 3 {
		r := reserve(t, s, t0, "q", "a", "", 1, time.Minute)
		if r.Token <= tok {
			t.Fatalf("round %d: token %d after %d", i, r.Token, tok)
		}
		tok = r.Token
		if _, err := s.Release(bg, t0, "q", r.HoldID, 0); err != nil {
			t.Fatal(err)
		}
		if st := s.Stats(); st.Resources != 2 || s.Tokens() != 0 {
			t.Fatalf("round %d after release: %d resources, %d tokens; want q's empty copy log kept until Reap", i, st.Resources, s.Tokens())
		}
		if i == 1 {
			continue // the next reserve finds the empty copy log
		}
		if err := s.Reap(bg, t0); err != nil {
			t.Fatal(err)
		}
		if st := s.Stats(); st.Resources != 1 || s.Tokens() != 1 {
			t.Fatalf("round %d after Reap: %d resources, %d tokens; want q dropped, its token kept", i, st.Resources, s.Tokens())
		}
	}
	if tok != 3 {
		t.Errorf("third token %d, want 3", tok)
	}
}

func TestSweeper(t *testing.T) {
	times := make(chan time.Time)
	s := memcopy.New(memcopy.Options{SweepInterval: time.Millisecond, Now: func() time.Time { return <-times }})
	reserve(t, s, t0, "r", "a", "", 2, time.Second)
	times <- at(time.Second)
	// The sweeper asks the time again only after reaping at T0+1s.
	times <- at(time.Second)
	st := s.Stats()
	close(times) // the sweeper's later reaps are at the zero time: no-ops
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if st.ReapedHolds != 1 || st.Holds != 0 || st.Resources != 0 {
		t.Errorf("after the sweep: %+v", st)
	}
	if _, err := s.Reserve(bg, t0, "r", cfg, copylog.ReserveRequest{Domain: "a", Copies: 1, HoldID: "h", Lease: time.Second}); !errors.Is(err, memcopy.ErrClosed) || !errors.Is(err, copystore.ErrUnavailable) {
		t.Errorf("Reserve after Close: %v, want ErrClosed wrapping ErrUnavailable", err)
	}
}

func TestShardsOption(t *testing.T) {
	for _, n := range []int{-1, 0, 1, 3, 1000} {
		s := memcopy.New(memcopy.Options{Shards: n})
		for i := range 20 {
			reserve(t, s, t0, fmt.Sprint("r", i), "a", "", 1, time.Minute)
		}
		if got := s.Stats(); got.Resources != 20 || got.Holds != 20 {
			t.Errorf("Shards %d: %+v", n, got)
		}
		s.Close()
	}
}

// The suite passes with a sweeper dropping emptied copy logs concurrently
// (it reaps at the wall clock, before T0: no lease lapses by it).
func TestConformanceWithSweeper(t *testing.T) {
	copystoretest.Run(t, func(t *testing.T) copystore.Store {
		return memcopy.New(memcopy.Options{Shards: 2, SweepInterval: 50 * time.Microsecond})
	})
}

// Reap running with operations keeps the gauges exact: once everything
// lapsed and was reaped, they are all zero.
func TestReapConcurrentGauges(t *testing.T) {
	s := memcopy.New(memcopy.Options{Shards: 2})
	defer s.Close()
	const workers, ops = 4, 300
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range ops {
				now := at(time.Duration(i) * time.Millisecond)
				res := fmt.Sprint("r", (w+i)%5)
				r, err := s.Reserve(bg, now, res, cfg, copylog.ReserveRequest{Domain: fmt.Sprint("d", w), Copies: 2, HoldID: fmt.Sprintf("h%d-%d", w, i),
					Session: fmt.Sprint("s", w, i%3), Lease: time.Duration(1+i%7) * time.Millisecond})
				if err != nil {
					t.Error(err)
					return
				}
				switch {
				case !r.OK:
				case i%4 == 0:
					// The reaper's now runs ahead of the workers': a hold
					// may be gone already.
					if _, err := s.Release(bg, now, res, r.HoldID, 1); err != nil && !errors.Is(err, copylog.ErrUnknownHold) {
						t.Error(err)
					}
				case i%4 == 1:
					if _, err := s.Transfer(bg, now, res, r.HoldID, 0, time.Millisecond, fmt.Sprintf("x%d-%d", w, i)); err != nil && !errors.Is(err, copylog.ErrUnknownHold) {
						t.Error(err)
					}
				case i%4 == 2:
					if _, err := s.ReleaseSession(bg, now, res, fmt.Sprint("s", w, i%3)); err != nil {
						t.Error(err)
					}
				}
			}
		})
	}
	wg.Go(func() {
		for i := range ops {
			if err := s.Reap(bg, at(time.Duration(i)*time.Millisecond)); err != nil {
				t.Error(err)
			}
		}
	})
	wg.Wait()
	st := s.Stats()
	if st.Granted == 0 || st.SessionHolds == 0 || st.LeaseExpiries == 0 {
		t.Errorf("the test did not exercise grants, session ends and expiries: %+v", st)
	}
	if err := s.Reap(bg, at(time.Hour)); err != nil {
		t.Fatal(err)
	}
	st = s.Stats()
	if st.Holds != 0 || st.Transfers != 0 || st.Copies != 0 || st.Resources != 0 {
		t.Errorf("after everything lapsed: %+v", st)
	}
	if got := st.Granted + st.Seized; uint64(st.LeaseExpiries)+st.SessionHolds > got {
		t.Errorf("more holds ended (%d expired, %d with sessions) than were made (%d)", st.LeaseExpiries, st.SessionHolds, got)
	}
}

// TestCollector: the store's gauges and counters read its Stats.
func TestCollector(t *testing.T) {
	s := memcopy.New(memcopy.Options{})
	defer s.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(s.Collector())
	res, err := s.Reserve(context.Background(), t0, "seat", &copylog.Config{DomainLimit: 10},
		copylog.ReserveRequest{Domain: "d", Copies: 4, HoldID: "h", Lease: time.Minute})
	if err != nil || !res.OK {
		t.Fatalf("reserve: %+v %v", res, err)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		m := f.GetMetric()[0]
		if g := m.GetGauge(); g != nil {
			got[f.GetName()] = g.GetValue()
		} else {
			got[f.GetName()] = m.GetCounter().GetValue()
		}
	}
	want := map[string]float64{"charon_copystore_holds": 1, "charon_copystore_transfers": 0,
		"charon_copystore_lease_expiries_total": 0, "charon_copystore_reaped_holds_total": 0, "charon_copystore_session_holds_total": 0}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (found %v), want %v", k, g, ok, v)
		}
	}
}
