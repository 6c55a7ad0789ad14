// Package escrow decides the requests of hot pairs from escrow leases
// (SPEC §10): a slice of a pair's budget that the shared store has
// already counted as used, granted by this replica without a round trip
// until the lease is spent or ends, the unused part then given back
// exactly. Every other request takes the shared path (Options.Remote), as
// without escrow.
//
// # A lease, and why it never over-grants
//
// A lease of n hits of a one-tier sliding window W, of length L (a
// twentieth of the policy's shortest window, at most Options.Lease:
// tiers.LeaseFor), is taken in two calls to the shared store (Options.Leaser, the Redis store
// itself):
//
//  1. Reserve n hits (at least one) for the instant at = r + L, r being
//     the store's present (store.Reserver, the reservation pacing makes:
//     tiers/reserve.go). The hits are stamped at, no earlier than any
//     instant they will be granted at, so no window forgets them while
//     they are granted; every later decision counts them.
//  2. Check the pair (a request of 0 hits) at the store's present v, and
//     give back at once what its counts exceed a limit by (tier, hard,
//     global). The reservation's walk was made at at, and so did not see
//     the hits granted in (r−W, at−W], which leave the window before at
//     but are still in it at r: alone, a reservation for a later instant
//     is exact only for an answer at that instant (pacing's), not for
//     answers spread before it (TestCheckGivesBackWhatTheWalkMissed).
//
// The lease grants from the moment the check has answered until r + L on
// this process's clock (until: the instant the reservation was sent plus
// L, which comes no later than at, since the store read its clock after
// that). The argument: take any window of W of answers and, of the
// answers in it, the one decided last by the shared state — a grant on the
// shared path at its instant, or a lease at its check v. Every other
// answer h of the window was counted by then (a lease's hits from its
// reservation on) and is stamped no earlier than it was answered, so
// after the window's start, which is later than v − W: the decision
// counted it. A grant on the shared path saw them all and granted within
// the limit; a lease's check saw them all, with the lease's n, and the
// lease grants only n minus the excess. So no window holds more answers
// than a limit. Hits are only ever counted longer than they are used
// (a lease's until the end of its window from at; a grant on the shared
// path joins a later lease's bucket), and a give-back takes away only hits
// never granted: escrow may grant less than the shared path alone would,
// never more. A replica that dies holds its leases until their hits leave
// the window, as counted hits do. A call whose answer is lost, a check or
// a give-back that fails, leave hits counted, never free.
//
// The store's approximations apply to leases as to every decision (a
// window of more than 64 hits counted in buckets, package tiers): a lease
// is as exact as a grant of the same hits would be.
//
// # What is decided from a lease, and what stays on the shared path
//
// A pair is leased when its policy is of the configuration in force, its
// descriptor's escrow: setting (or the server's --escrow, Options.Default)
// is on, and tiers.LeaseFor leases it: one tier active for ever (a
// rate_limit), with or without hard and global limits, whose shortest
// window is at least tiers.LeaseRatio times tiers.MinLease. Everything
// else stays on the shared path, exactly as today:
//
//   - token buckets, fixed windows and calendar quotas (a reservation of
//     theirs is exact for an answer at its instant, not before it; a fixed
//     window's give-back after its window ended would give back into the
//     next one), stacks of several tiers and tiers with an active period (a
//     burst or a phase is decided by the shared state), post-paid policies
//     (a debt is counted after the fact);
//   - a request's own limit (Envoy's limit override): its numbers may
//     differ from request to request, and a lease is exact for the limit
//     it was checked against;
//   - refunds (is_negative_hits), and a group whose hits this replica's
//     leases do not hold in full (a request of copies with a minimum
//     included): the shared path may grant them from the budget no lease
//     holds;
//   - a pair until its first lease arrives (Tick takes leases; a decision
//     never waits for one), and a replica beyond its fair share.
//
// A request is still all or nothing: the groups its leases hold are taken
// locally, the rest (and any refund) goes to the shared store in one
// call, and the local takes are put back when that call rejects or fails.
// A pair whose last lease was refused (it is full) is rejected locally for
// at most one lease length, with the store's wait; in a request that goes
// to the shared store anyway, the shared store decides it.
//
// A decision from a lease reports the lease's view: Remaining is what this
// replica's leases still hold, ResetAfter when the first of them ends.
//
// # Which pairs, and how big a lease
//
// A pair enters escrow when its decisions on this replica reach
// Options.Threshold per second, and ten per lease (a lease costs about
// three calls: its reservation, its check, its give-back), counted in a
// count-min sketch so that cold pairs cost a hash and two atomic adds; it
// leaves when its rate stays under half of that for CoolOff. Tick, every
// quarter of the pair's lease and at once when its leases run short,
// takes a lease when they will not last a tick and a half, of the pair's
// hit rate over one lease and a quarter (twice the last lease when that
// ran out early); a spent lease frees its slot at once.
//
// Under SizeFair a lease is at most this replica's max-min fair share of
// the pair's limit less what its leases still hold in the window. The
// shares are fairshare.Allocate's, run on the share store RLQS uses, by
// the demand each replica in escrow on the pair reports: its hits over
// the last Rebalance interval, per window. The rounds fall on the same
// instants on every replica (multiples of Rebalance on the clock), and a
// replica held at its share looks again half a round later, so that a
// share one replica releases is taken by another in the same round or
// half a round later: after a shift of demand, the shares are the fair
// split of the new demands within two rounds (TestFairSharesFollowDemand).
// A replica over its share takes the shared path: it takes only what no
// lease holds.
//
// # Regions
//
// A Region is the Leaser of the replicas of one region (Flags.Home): it
// leases slices of the home's budgets with the same protocol (leaseCalls)
// and keeps them in the region's Pool, and the region's replicas take
// their leases from those slices (see Region for why that is exact). A
// decision from a lease never leaves the region; the rest is decided at
// the home (Options.Remote). A region's replica (Options.Regional) leases
// for at most RegionReplicaLease, and from the threshold alone.
//
// # Time
//
// One clock, Options.Now, which callers of Decide must use too: leases
// are granted from on its instants. On Redis the store keeps its own
// clock; a lease's end is measured on this process's from the instant its
// reservation was sent, which assumes the two clocks run at the same rate
// over one lease (their offset does not matter).
package escrow
