package fairshare

import (
	"math"
	"time"
)

// Rising and Falling are the weights of the newest report in a smoothed
// rate, when it is above and below the rate so far. A report's counts
// include the denied requests, so a report is the true demand of its
// interval: a rise is believed mostly at once (an instance held at its
// share shows its demand in full), and a fall almost at once, since a
// share held by an instance that no longer needs it is lost to those that
// do; the rest damps the noise of one interval.
const (
	Rising  = 0.7
	Falling = 0.9
)

// Smooth returns the smoothed request rate (per second) after a report of
// count requests (allowed and denied) over elapsed, given the previous rate
// (known false: none yet). Envoy's first report of a bucket has an elapsed
// time of 0 and its times are whole seconds: an elapsed time under one
// interval counts as one interval.
func Smooth(prev float64, known bool, count uint64, elapsed, interval time.Duration) float64 {
	elapsed = max(elapsed, interval, time.Second)
	rate := float64(count) / elapsed.Seconds()
	switch {
	case !known:
		return rate
	case rate >= prev:
		return Rising*rate + (1-Rising)*prev
	}
	return Falling*rate + (1-Falling)*prev
}

// Demand is the claim of an instance with a smoothed rate (per second) on a
// budget refilled every fill: what it asked for per fill, at least one
// token (so that an idle instance's first requests pass and show).
// No more headroom is needed for a demand to grow (an instance held at its
// share reports its denials, so its demand shows above the share), and every
// token of headroom a satisfied instance holds is a token the instances
// whose demand is unmet do not get.
func Demand(rate float64, fill time.Duration) int64 {
	d := rate * fill.Seconds()
	if d >= math.MaxInt64/2 || math.IsNaN(d) {
		return math.MaxInt64 / 2
	}
	return max(int64(math.Ceil(d-1e-9)), 1)
}
