package xdsconfig

import (
	"errors"
	"math"
	"time"
)

// Backoff is the wait before each new stream after one failed (the server
// could not be reached, or the stream broke), with envoyproxy/ratelimit's
// XDS_CLIENT_BACKOFF_* meaning: attempt n waits Initial×Factor^n, at least
// Initial and at most Max; with Jitter, a uniformly drawn duration between
// Initial and that. So a Factor of 1 or less waits Initial every time (as
// envoyproxy/ratelimit does with its default factor, 0.5). The count of
// attempts starts again after a stream that delivered a response.
type Backoff struct {
	Initial, Max time.Duration
	Factor       float64
	Jitter       bool
}

// DefaultBackoff is Charon's backoff: 1 s, doubling up to 60 s, jittered.
var DefaultBackoff = Backoff{Initial: time.Second, Max: time.Minute, Factor: 2, Jitter: true}

// Check refuses a backoff that cannot work.
func (b Backoff) Check() error {
	switch {
	case b.Initial <= 0:
		return errors.New("the initial interval must be positive")
	case b.Max < b.Initial:
		return errors.New("the maximum interval must be at least the initial one")
	case !(b.Factor > 0) || math.IsInf(b.Factor, 0):
		return errors.New("the factor must be a positive number")
	}
	return nil
}

// Wait returns the wait before retry n (0 for the first), r being a
// uniform draw in [0, 1) (used with Jitter only).
func (b Backoff) Wait(n int, r float64) time.Duration {
	if b.Initial >= b.Max {
		return b.Max
	}
	d := float64(b.Initial) * math.Pow(b.Factor, float64(n))
	switch {
	case math.IsNaN(d) || d > float64(b.Max):
		d = float64(b.Max)
	case d < float64(b.Initial):
		d = float64(b.Initial)
	}
	if b.Jitter {
		d = float64(b.Initial) + r*(d-float64(b.Initial))
	}
	return time.Duration(d)
}
