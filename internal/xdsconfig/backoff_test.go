package xdsconfig_test

import (
	"testing"
	"time"

	"github.com/charonlimit/charon/internal/xdsconfig"
)

func TestBackoffWait(t *testing.T) {
	s := time.Second
	lyft := xdsconfig.Backoff{Initial: 10 * s, Max: 60 * s, Factor: 0.5, Jitter: true}
	doubling := xdsconfig.Backoff{Initial: s, Max: 60 * s, Factor: 2}
	for _, tc := range []struct {
		name string
		b    xdsconfig.Backoff
		n    int
		r    float64
		want time.Duration
	}{
		{"envoyproxy/ratelimit's defaults: always the initial interval", lyft, 0, 0.9, 10 * s},
		{"envoyproxy/ratelimit's defaults, later", lyft, 7, 0.9, 10 * s},
		{"doubling", doubling, 0, 0, s},
		{"doubling, third retry", doubling, 2, 0, 4 * s},
		{"doubling, capped", doubling, 10, 0, 60 * s},
		{"doubling, far on", doubling, 5000, 0, 60 * s},
		{"jitter draws between initial and the step", xdsconfig.Backoff{Initial: s, Max: 60 * s, Factor: 2, Jitter: true}, 3, 0.5, 4500 * time.Millisecond},
		{"jitter at 0 is the initial interval", xdsconfig.Backoff{Initial: s, Max: 60 * s, Factor: 2, Jitter: true}, 3, 0, s},
		{"initial above max", xdsconfig.Backoff{Initial: 2 * s, Max: s, Factor: 2}, 0, 0, s},
	} {
		if got := tc.b.Wait(tc.n, tc.r); got != tc.want {
			t.Errorf("%s: Wait(%d, %v) = %v, want %v", tc.name, tc.n, tc.r, got, tc.want)
		}
	}
	for _, b := range []xdsconfig.Backoff{{Initial: 0, Max: s, Factor: 2}, {Initial: 2 * s, Max: s, Factor: 2}, {Initial: s, Max: s, Factor: 0}} {
		if b.Check() == nil {
			t.Errorf("%+v: accepted", b)
		}
	}
}
