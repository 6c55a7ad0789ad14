package fairshare

import (
	"math"
	"time"
)

// Smoothing is the weight of the newest report in a smoothed rate.
const Smoothing = 0.5

// Smooth returns the smoothed request rate (per second) after a report of
// count requests (allowed and denied) over elapsed, given the previous rate
// (known false: none yet). Envoy's first report of a bucket has an elapsed
// time of 0 and its times are whole seconds: an elapsed time under one
// interval counts as one interval.
func Smooth(prev float64, known bool, count uint64, elapsed, interval time.Duration) float64 {
	elapsed = max(elapsed, interval, time.Second)
	rate := float64(count) / elapsed.Seconds()
	if !known {
		return rate
	}
	return Smoothing*rate + (1-Smoothing)*prev
}

// Demand is the claim of an instance with a smoothed rate (per second) on a
// budget refilled every fill: what it used per fill, with 10% and one token
// of headroom so that a growing demand shows (an instance held at its share
// reports its denials, and its demand rises above the share).
func Demand(rate float64, fill time.Duration) int64 {
	d := rate * fill.Seconds() * 1.1
	if d >= math.MaxInt64/2 || math.IsNaN(d) {
		return math.MaxInt64 / 2
	}
	return int64(math.Ceil(d)) + 1
}
