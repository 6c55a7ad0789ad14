package redisstore

import (
	"time"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/tiers"
)

// A concurrency limit's refund names the take whose slots it gives back
// (store.Item.SlotsAt, tiers.RefundSlots) by the instant they were stamped
// with, which the function's reply tells (the instant its call decided at,
// the Redis master's by default): the two ends of that round trip are
// here, so that the call's encoding and reading stay as they are for every
// other item.

// itemMin is the min the function is sent for it: a refund's is ignored
// and carries instead, negated, the instant of the take whose slots it
// gives back, at least 1 µs (apply.lua reads it so), when it names one.
func itemMin(it *store.Item) int64 {
	if it.Refund && !it.SlotsAt.IsZero() {
		return -max(1, it.SlotsAt.UnixMicro())
	}
	return it.Min
}

// stampSlots sets d.SlotsAt, for a concurrency limit's grant, to used, the
// instant (µs) the call that granted it decided at.
func stampSlots(p *tiers.Policy, d *tiers.Decision, used int64) {
	if p.Concurrency && d.OK && d.Granted > 0 {
		d.SlotsAt = time.UnixMicro(used)
	}
}
