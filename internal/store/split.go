package store

import "github.com/charonlimit/charon/tiers"

// Split gives the members of the group item i leads (Plan) the group's
// answer out[i], sharing its grant as Apply does: each member gets its Min,
// then the rest of the grant up to its Hits, first come first served; a
// rejection gives every member Granted 0. A store that decides some groups
// itself (the escrow store, from its leases) answers them with it.
func Split(plan *Plan, items []Item, i int, out []tiers.Decision) {
	split(plan, items, i, out)
}
