package redisfunc

// Clock chooses the clock a function decides on. The zero value is
// ClockRedis.
type Clock uint8

const (
	// ClockRedis (the default) reads the Redis master's clock (TIME) inside
	// the function, with no extra round trip; the caller's now is ignored.
	// Every process sharing the Redis then decides on one clock, whatever
	// the skew of their hosts, and keys expire (PXAT) on the clock that
	// wrote them.
	ClockRedis Clock = iota
	// ClockCaller decides at the now the caller passes (tests replaying
	// traces; a single process). Key expiry times are then in the caller's
	// clock: a caller clock ahead of Redis's keeps keys longer, one behind
	// forgets them earlier.
	ClockCaller
)
