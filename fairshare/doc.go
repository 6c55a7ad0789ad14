// Package fairshare splits a rate budget among the instances that draw on
// it, max-min fair, as leases: the allocation policy of the Rate Limit Quota
// Service. It is a pure function of the instances' demands, the shares they
// hold and the time: it does no I/O, starts no goroutines and never reads
// the clock.
//
// A budget is Limit tokens per fill interval (a rule's limit over its
// window). Each instance (an Envoy stream reporting the budget's bucket) has
// a Claim: its smoothed demand, the share it holds and when that share's
// lease expires. Allocate gives the instances the caller serves ("mine") new
// shares:
//
//   - max-min fair: an instance that needs less than an equal split gets
//     what it needs, the rest is split equally among the others (the
//     remainder of the integer division goes one token each, in ID order);
//   - a new instance, whose demand is not known yet (Unknown), counts as
//     wanting everything, so it gets a fair share at once;
//   - leases: a share the caller does not serve (another replica's instance,
//     or one whose stream was lost) counts at what it holds until it
//     expires, then it is reclaimed. The caller's shares are fitted into
//     what the others leave, so the unexpired shares never sum above Limit
//     whatever the others do;
//   - stability: a share that would change by no more than the tolerance
//     keeps its old value when the budget still holds it, because every new
//     assignment starts a new, full token bucket in Envoy.
package fairshare
