package store

import (
	"fmt"
	"strings"
	"time"
)

// Holding is what this process holds of a pair's budget, decided without
// the shared store: the escrow leases of package internal/escrow.
type Holding struct {
	// Leases is the number of live leases; Held the hits they may still
	// grant, Granted those they granted; Until when the last ends.
	Leases        int
	Held, Granted int64
	Until         time.Time
	// Rate is the pair's decisions per second on this process; Demand the
	// hits per window it reports for fair shares, Share its fair share
	// per window (-1: none yet, or sized by demand alone).
	Rate   float64
	Demand int64
	Share  int64
}

// String says h in words, for explain.
func (h Holding) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "in escrow on this replica (%.0f decisions/s): %d hits held in %d leases", h.Rate, h.Held, h.Leases)
	if h.Leases > 0 {
		fmt.Fprintf(&b, " until %s, %d granted from them", h.Until.UTC().Format(time.RFC3339Nano), h.Granted)
	}
	if h.Share >= 0 {
		fmt.Fprintf(&b, "; fair share %d per window, demand %d", h.Share, h.Demand)
	}
	return b.String()
}

// Holder is a Store that holds parts of pairs' budgets in this process
// (the escrow store). Holding returns what it holds of it's pair at now,
// and false when the pair is not in escrow.
type Holder interface {
	Holding(it *Item, now time.Time) (Holding, bool)
}
