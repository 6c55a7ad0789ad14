package resilient

import (
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
