package escrowsim

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/tiers"
)

// TestNeverOverGrants runs short simulations, each with one of the
// scenario's events, and demands that no window of grants ever holds
// more than the limit, whatever the leases, the kill, the cut or the
// shift did. It asserts no latency, throughput or false rejection figure;
// only that each run did what it was asked to (requests granted, leases
// taken where the link is fast, requests failed while a region was cut
// off, the killed replica's state).
func TestNeverOverGrants(t *testing.T) {
	if testing.Short() {
		t.Skip("runs in real time")
	}
	base := Options{Limit: 60, Window: time.Second, Replicas: 3, Regions: 1, Duration: 3 * time.Second, Rate: 10, Skew: 10, Seed: 1}
	tests := []struct {
		name       string
		set        func(*Options)
		leases     bool // leases must be taken
		failed     bool // some requests must fail
		killedFrom int  // the first window that shows a killed replica (0: none)
	}{
		{name: "shift and kill", set: func(o *Options) { o.Shift, o.Kill = time.Second, 2*time.Second }, leases: true, killedFrom: 2},
		// 600 per 2 s: leases of 100 ms, so a pair is hot from 100
		// decisions a second; the heavy replica sees 225, far enough
		// above it on a loaded machine.
		{name: "a bucketed window at 90%", set: func(o *Options) {
			o.Limit, o.Window, o.Rate, o.Shift = 600, 2*time.Second, 0.9, 1500*time.Millisecond
		}, leases: true},
		{name: "regions with pools, one cut off", set: func(o *Options) {
			o.Regions, o.Latency, o.Window, o.Limit, o.Pools = 3, 20*time.Millisecond, 2*time.Second, 100, true
			o.Duration, o.Shift, o.Cut, o.CutFor, o.CutRegion = 4*time.Second, time.Second, 1500*time.Millisecond, time.Second, 0
		}, failed: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := base
			tc.set(&o)
			res, err := Run(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			s := res.Summary
			t.Logf("%d requests, %d granted, most %d in a window, %d leases, %d failed", s.Requests, s.Granted, s.MostGranted, s.Leases, s.Failed)
			if s.OverGrants != 0 || s.MostGranted > o.Limit {
				t.Errorf("over-grants %d, most granted in a window %d: want 0 and at most the limit %d", s.OverGrants, s.MostGranted, o.Limit)
			}
			for _, r := range res.Rows {
				if r.MostGranted > o.Limit {
					t.Errorf("window ending %vs: most granted %d, over the limit %d", r.End, r.MostGranted, o.Limit)
				}
			}
			if s.Granted == 0 || s.Rejected == 0 && o.Rate > 1 {
				t.Errorf("granted %d, rejected %d: the run decided nothing of note", s.Granted, s.Rejected)
			}
			if tc.leases && s.Leases == 0 {
				t.Error("no lease taken: the run did not exercise escrow")
			}
			if tc.failed && s.Failed == 0 {
				t.Error("no request failed: the region was not cut off")
			}
			if tc.killedFrom > 0 {
				k := -1
				for i, rr := range res.Rows[tc.killedFrom-1].Replicas {
					if rr.Killed {
						k = i
					}
				}
				if k < 0 {
					t.Fatalf("window %d: no replica killed", tc.killedFrom)
				}
				for _, r := range res.Rows[tc.killedFrom:] {
					if r.Replicas[k].Granted != 0 {
						t.Errorf("window ending %vs: the killed replica %d granted %d", r.End, k, r.Replicas[k].Granted)
					}
				}
			}
		})
	}
}

// TestMeasure: the rows and summary computed from a fixed record, the
// over-grants and the false rejections counted as documented.
func TestMeasure(t *testing.T) {
	ms := func(n int64) int64 { return n * int64(time.Millisecond) }
	o := Options{Limit: 3, Window: time.Second, Replicas: 2, Duration: 2 * time.Second}
	recs := []record{
		{replica: 0, outcome: granted, sent: ms(0), at: ms(0), took: ms(1)},
		{replica: 0, outcome: granted, sent: ms(100), at: ms(100), took: ms(1)},
		{replica: 1, outcome: rejected, sent: ms(200), at: ms(200), took: ms(2)}, // 2 in the window: under the limit, not by the margin (1)
		{replica: 1, outcome: granted, sent: ms(300), at: ms(300), took: ms(1)},
		{replica: 0, outcome: rejected, sent: ms(400), at: ms(400), took: ms(1)}, // 3: the window is full
		{replica: 1, outcome: granted, sent: ms(450), at: ms(1050), took: ms(600), shared: true},
		// 1050: the grants of (50, 1050] are 100, 300, 1050: not over.
		{replica: 0, outcome: granted, sent: ms(1099), at: ms(1099), took: ms(1)},
		// 1099: 100, 300, 1050, 1099: one over the limit.
		{replica: 0, outcome: failed, sent: ms(1500), at: ms(1500), took: ms(80)},
		{replica: 1, outcome: rejected, sent: ms(1600), at: ms(1600), took: ms(1)}, // 1050, 1099: 2, under the limit
		// After the run's end, counted in its last window: none in the
		// window before it, a false rejection.
		{replica: 1, outcome: rejected, sent: ms(2100), at: ms(2100), took: ms(1)},
	}
	sm := func(home, region uint64, share0 int64) sample {
		return sample{shares: []int64{share0, -1}, held: []int64{1, 0}, killed: []bool{false, true}, home: home, region: region}
	}
	res := measure(o, recs, []sample{sm(0, 0, -1), sm(5, 1, 2), sm(9, 3, 1), sm(10, 4, 1)})
	want := &Result{Limit: 3, Window: 1, Measured: 1, Margin: 1,
		Rows: []Row{
			{End: 1, Requests: 5, Granted: 3, Rejected: 2, MostGranted: 3, HomeCalls: 1, RegionCalls: 0.2, P50: 1, P99: 600,
				Replicas: []ReplicaRow{{Granted: 2, Share: 2, Held: 1}, {Granted: 1, Share: -1, Killed: true}}},
			{End: 2, Requests: 5, Granted: 2, Rejected: 2, Failed: 1, False: 1, MostGranted: 4, HomeCalls: 1, RegionCalls: 0.6, P50: 1, P99: 80,
				Replicas: []ReplicaRow{{Granted: 1, Share: 1, Held: 1}, {Granted: 1, Share: -1, Killed: true}}},
		},
		Summary: Summary{Requests: 10, Granted: 5, Rejected: 4, Failed: 1, False: 1, FalseShare: 0.1, UnderLimit: 3,
			MostGranted: 4, OverGrants: 1, GrantedPerWindow: 2.5, HomeCalls: 1, RegionCalls: 0.4, P50: 1, P99: 600},
	}
	if diff := cmp.Diff(want, res); diff != "" {
		t.Errorf("measure (-want +got):\n%s", diff)
	}
}

func TestMeasuredWindowAndMargin(t *testing.T) {
	for _, tc := range []struct {
		limit  int64
		w      time.Duration
		want   time.Duration
		margin int64
	}{
		{64, time.Second, time.Second, 3},
		{1000, time.Second, time.Second - 15625*time.Microsecond, 50},
		{1000, time.Minute, time.Minute - 937500*time.Microsecond, 50},
		{65, 100 * time.Millisecond, 100*time.Millisecond - 1563*time.Microsecond, 3},
		{10, time.Second, time.Second, 1},
	} {
		if got := MeasuredWindow(tc.limit, tc.w); got != tc.want {
			t.Errorf("MeasuredWindow(%d, %v) = %v, want %v", tc.limit, tc.w, got, tc.want)
		}
		if got := Margin(tc.limit); got != tc.margin {
			t.Errorf("Margin(%d) = %d, want %d", tc.limit, got, tc.margin)
		}
	}
}

// TestCheck: each bad option is refused with its flag named.
func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		set  func(*Options)
		want string
	}{
		{func(o *Options) { o.Limit = 0 }, "--limit 0"},
		{func(o *Options) { o.Window = 10 * time.Millisecond }, "--window 10ms"},
		{func(o *Options) { o.Replicas, o.Regions, o.Kill = 0, 1, 0 }, "--replicas 0"},
		{func(o *Options) { o.Regions = 4 }, "--regions 4"},
		{func(o *Options) { o.Duration = time.Millisecond }, "--duration 1ms"},
		{func(o *Options) { o.Latency = -1 }, "--latency -1ns"},
		{func(o *Options) { o.Rate = 0 }, "--rate 0"},
		{func(o *Options) { o.Skew = -2 }, "--skew -2"},
		{func(o *Options) { o.CutFor = -time.Second }, "--cut-for -1s"},
		{func(o *Options) { o.Replicas, o.Regions = 1, 1 }, "--kill 45s"},
		{func(o *Options) { o.CutRegion = 1 }, "--cut-region 1"},
	} {
		o := DefaultOptions()
		o.CutRegion = 0
		tc.set(&o)
		err := o.Check()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Check: %v, want an error naming %q", err, tc.want)
		}
	}
	o := DefaultOptions()
	o.CutRegion = 0
	if err := o.Check(); err != nil {
		t.Errorf("Check of the defaults: %v", err)
	}
}

// TestLink: a cut link fails a call before the home sees it; a call
// through a live link is decided on the home and stamps the instant.
func TestLink(t *testing.T) {
	mem := memstore.New(memstore.Options{})
	defer mem.Close()
	var calls atomic.Uint64
	l := &link{home: &homeStore{store: mem}, calls: &calls}
	pol := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 1, Window: time.Minute, Active: tiers.Unbounded}}}
	items := []store.Item{{Key: store.Key{Resource: "r", Domain: "d"}, Policy: pol, Hits: 1, Min: 1}}
	out := make([]tiers.Decision, 1)
	l.cut.Store(true)
	var stamp time.Time
	if err := l.Decide(withStamp(context.Background(), &stamp), time.Time{}, items, out); !errors.Is(err, ErrCut) {
		t.Fatalf("Decide on a cut link: %v, want ErrCut", err)
	}
	if !stamp.IsZero() {
		t.Errorf("a call on a cut link stamped %v", stamp)
	}
	l.cut.Store(false)
	before := time.Now()
	if err := l.Decide(withStamp(context.Background(), &stamp), time.Time{}, items, out); err != nil || !out[0].OK {
		t.Fatalf("Decide: %v, %+v: want granted (the cut call took nothing)", err, out[0])
	}
	if stamp.Before(before) {
		t.Errorf("stamp %v before the call %v", stamp, before)
	}
	if got := calls.Load(); got != 2 {
		t.Errorf("calls %d, want 2", got)
	}
}
