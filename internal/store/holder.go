package store

import "time"

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

// Holder is a Store that holds parts of pairs' budgets in this process
// (the escrow store). Holding returns what it holds of it's pair at now,
// and false when the pair is not in escrow.
type Holder interface {
	Holding(it *Item, now time.Time) (Holding, bool)
}
