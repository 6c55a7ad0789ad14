package rlqs

import (
	"math"
	"time"

	"github.com/charonlimit/charon/fairshare"
)

// An Envoy's demand on a budget, from its reports. Envoy's filter reports
// every 5 s, whatever its reporting_interval says, with elapsed times cut
// to whole seconds. Requests arrive at random: a count over 5 s of a bucket
// at 8 per second varies by its square root, 16 %. A split that followed
// every report would move an Envoy's share by that much at every report,
// and every new assignment starts a full token bucket in Envoy. So a
// bucket's demand is estimated over time (estimate), and the demand it
// claims in the split (claim) moves only when the estimate leaves the band
// of its noise and of the tolerance around it, or when the Envoy, its
// claim met, still ran out of tokens.
const (
	// smoothing is the horizon of the estimate: a steady demand is
	// averaged over about that long (a running mean until then).
	smoothing = 30 * time.Second
	// jumpSigmas: two reports in a row this many standard deviations from
	// the estimate on one side, or one twice as far, are a change of
	// demand, believed at once.
	jumpSigmas = 3
	// bandSigmas: the claim moves when the estimate is this many of its
	// standard deviations away (and more than the tolerance).
	bandSigmas = 2
	// starvedFraction: an Envoy whose share meets its claim and yet denied
	// more than this part of a report's requests (and more than one) ran
	// its bucket dry: its claim is too low, whatever the estimate says.
	// MetBurst tokens turn away under 2 % when the claim is right.
	starvedFraction = 0.02
)

// window is the time a report's counts cover: the time since the bucket's
// previous report on this stream, as this process' clock measured it
// (gap), within the whole seconds the report states (reported, cut by
// Envoy: the time it covers is at least reported and less than a second
// more). Envoy reports a bucket created between two reports with the
// others, its first elapsed time cut from up to 5 s to as little as 1 s;
// the gap, measured to the millisecond, is what the counts covered. A gap
// outside the report's second (the stream's messages delayed) gives way to
// the report.
func window(gap, reported time.Duration) time.Duration {
	return min(max(gap, reported), reported+time.Second-time.Millisecond)
}

// estimate is a bucket's smoothed request rate (allowed and denied, per
// second) and its noise. The zero value knows nothing.
type estimate struct {
	rate float64
	// v is the variance of rate per unit of rate: the counts are Poisson,
	// so the variance of a count is its mean.
	v float64
	// age is the time the estimate has averaged over, in seconds, since
	// it was last reset.
	age   float64
	known bool
	// out is the side (1 above, -1 below, 0 neither) on which the last
	// report was beyond jumpSigmas; outCount and outSec its count and
	// seconds.
	out              int
	outCount, outSec float64
}

// add takes a report of count requests over w.
func (e *estimate) add(count uint64, w time.Duration) {
	sec := w.Seconds()
	x := float64(count) / sec
	if !e.known {
		e.reset(x, sec)
		return
	}
	// A report beyond jumpSigmas of the noise of a report and of the
	// estimate: a change of demand, believed at once when it is twice that
	// far, or when the report before was beyond it on the same side (a
	// random count that far out comes once in hundreds of reports: alone,
	// it would move a claim, and a new assignment, for nothing).
	dev := (x - e.rate) / math.Sqrt(max(e.rate, 1/sec)*(1/sec+e.v))
	out := 0
	switch {
	case dev > jumpSigmas:
		out = 1
	case dev < -jumpSigmas:
		out = -1
	}
	switch {
	case math.Abs(dev) > 2*jumpSigmas:
		e.reset(x, sec)
		return
	case out != 0 && out == e.out:
		sum := e.outCount + x*sec
		e.reset(sum/(e.outSec+sec), e.outSec+sec)
		return
	}
	e.out, e.outCount, e.outSec = out, x*sec, sec
	// An exponential average over smoothing, a plain mean of the reports
	// while they cover less.
	k := max(1-math.Exp(-sec/smoothing.Seconds()), sec/(e.age+sec))
	e.rate += k * (x - e.rate)
	e.v = (1-k)*(1-k)*e.v + k*k/sec
	e.age += sec
}

// reset starts the estimate again at rate x, seen over sec seconds.
func (e *estimate) reset(x, sec float64) {
	*e = estimate{rate: x, v: 1 / sec, age: sec, known: true}
}

// sd is the standard deviation of the estimate's noise.
func (e *estimate) sd() float64 { return math.Sqrt(max(e.rate, 1/smoothing.Seconds()) * e.v) }

// claimOf is the demand (tokens per fill) a bucket claims in the split
// after a report: cur (fairshare.Unknown: none yet) unless the estimate
// moved out of the band around it, by more than tolerance and by more than
// its noise; or, when starved (see starvedFraction), raised at least beyond
// the tolerance, so that the split does not keep the share it held.
func claimOf(cur int64, e *estimate, fill time.Duration, tolerance float64, starved bool) int64 {
	want := fairshare.Demand(e.rate, fill)
	if cur < 0 {
		return want
	}
	c := float64(cur) / fill.Seconds()
	above := int64(math.Ceil(float64(cur)*(1+tolerance))) + 1 // beyond what the split keeps
	band := max(tolerance*c, bandSigmas*e.sd())
	switch {
	case starved:
		return max(want, int64(math.Ceil(float64(cur)*(1+2*tolerance)))+1)
	case e.rate > c+band:
		return max(want, above)
	case e.rate < c-band:
		return want
	}
	return cur
}

// met reports whether a share meets a claim, up to the tolerance the split
// keeps a held share within.
func met(share, claim int64, tolerance float64) bool {
	return claim >= 0 && float64(share) >= float64(claim)*(1-tolerance)
}
