package tiers

import (
	"math"
	"time"
)

// Bounds that keep every quantity of the package an integer below 2^53, so
// that a Lua 5.1 implementation (whose numbers are doubles) computes exactly
// what this package computes.
const (
	// MaxTiers is the largest number of tiers a policy may have.
	MaxTiers = 64
	// MaxLimit is the largest limit, hard limit, global limit, capacity or
	// refill a policy may name.
	MaxLimit int64 = 1 << 40
	// MaxDuration is the longest finite duration a policy may name (about 35
	// years); longer periods must be written Unbounded.
	MaxDuration time.Duration = (1 << 50) * time.Microsecond
	// maxCopies bounds copies and min: larger requests are clamped to it,
	// which changes no answer since no policy can grant that many.
	maxCopies int64 = 1 << 50
)

// inf is Unbounded in microseconds: Lua's math.huge.
const inf int64 = math.MaxInt64

// second is one second in microseconds, the span of the hard and global
// limits.
const second int64 = 1_000_000

// Forever is what ForgetAt returns for a state that must be kept for ever
// (a tier above the first one with an unbounded active period was entered).
// It is the instant math.MaxInt64 microseconds after the Unix epoch. It must
// not be modified.
var Forever = time.UnixMicro(math.MaxInt64)

// Micros returns d in whole microseconds, truncated, the unit of time inside
// the package and of the compact form (AppendCompact); Unbounded becomes
// math.MaxInt64 (Lua's math.huge in a port).
func Micros(d time.Duration) int64 {
	if d == Unbounded {
		return inf
	}
	return d.Microseconds()
}

// FromMicros returns us microseconds as a Duration, the inverse of Micros:
// math.MaxInt64, and anything too long for a Duration, becomes Unbounded.
func FromMicros(us int64) time.Duration {
	if us >= inf/int64(time.Microsecond) {
		return Unbounded
	}
	return time.Duration(us) * time.Microsecond
}

// addSat adds b >= 0 to a, saturating at inf.
func addSat(a, b int64) int64 {
	if a == inf || b == inf || (b > 0 && a > inf-b) {
		return inf
	}
	return a + b
}

// floorDiv is a/b rounded towards minus infinity (Lua: math.floor(a / b)).
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// ceilDiv is a/b rounded up, for a >= 0 and b > 0.
func ceilDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 {
		q++
	}
	return q
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

func clampCopies(n int64) int64 {
	if n < 0 {
		return 0
	}
	if n > maxCopies {
		return maxCopies
	}
	return n
}
