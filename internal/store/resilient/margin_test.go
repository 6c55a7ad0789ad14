package resilient

import (
	"context"
	"testing"
	"time"
)

// TestRemoteDeadlineMargin: the remote's deadline keeps the larger of the
// margin and its share of the time left before the caller's, at fixed
// instants.
func TestRemoteDeadlineMargin(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ms := time.Millisecond
	for _, tc := range []struct {
		margin time.Duration
		share  float64
		left   time.Duration
		want   time.Duration // kept before the caller's deadline
	}{
		{0, 0, 20 * ms, 5 * ms},                 // Envoy's 20 ms: a quarter
		{0, 0, 5 * time.Second, 1250 * ms},      // a direct caller allowing seconds
		{0, 0, 4 * ms, 2 * ms},                  // the floor
		{0, 0, ms, 2 * ms},                      // less than the floor left: at once
		{3 * ms, -1, 20 * ms, 3 * ms},           // the margin alone
		{3 * ms, 0.5, 20 * ms, 10 * ms},         // half
		{time.Microsecond, 2, 20 * ms, 20 * ms}, // a share above 1 is 1
	} {
		s := New(nil, Options{Margin: tc.margin, MarginShare: tc.share})
		if got := s.remoteDeadline(t0.Add(tc.left), t0); got != t0.Add(tc.left-tc.want) {
			t.Errorf("margin %v, share %v, %v left: remote deadline %v before the caller's, want %v",
				tc.margin, tc.share, tc.left, tc.left-got.Sub(t0), tc.want)
		}
		s.Close()
	}
}

// TestReserveRemoteMargin: a reservation's call to the remote keeps the
// same time before the caller's deadline as Decide's (a quarter of a
// second when a second is left, not the 2 ms floor).
func TestReserveRemoteMargin(t *testing.T) {
	s := New(nil, Options{})
	defer s.Close()
	d := time.Now().Add(time.Second)
	ctx, cancel := context.WithDeadline(context.Background(), d)
	defer cancel()
	var got time.Time
	before := time.Now()
	if _, err := s.reserveRemote(ctx, func(ctx context.Context) (time.Time, error) {
		got, _ = ctx.Deadline()
		return time.Time{}, nil
	}); err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	// The call read the time somewhere between before and after.
	lo, hi := max(2*time.Millisecond, d.Sub(after)/4), max(2*time.Millisecond, d.Sub(before)/4)
	if kept := d.Sub(got); kept < lo || kept > hi {
		t.Errorf("the remote's deadline is %v before the caller's, want a quarter of the time left, in [%v, %v]", kept, lo, hi)
	}
}
