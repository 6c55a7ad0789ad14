// Package tierstest reads the scenario scripts of package tiers
// (tiers/testdata/*.txt), so that the same scripts are replayed against
// tiers itself and against every store (internal/store/storetest).
//
// A script gives a policy, then steps at instants relative to its start:
//
//	# comments run to the end of the line
//	tier limit=5 window=1s active=unbounded cooldown=15s skippable
//	hard 10
//	global 20
//	bucket capacity=10 refill=1 per=1s
//	fixed limit=5 unit=minute
//	concurrency limit=2 ttl=10s       (one tier of slots: Policy.Concurrency)
//	start 2024-05-01T12:00:00Z        (the instant "at 0s" names; default DefaultStart)
//
//	at 1.5s request 3 [min 2] [as b] -> granted 3 tier 1 [hits 3] [remaining 2] [burst|noburst]
//	at 2s request 1 -> rejected [tier 1] [retry 500ms] [hard] [global]
//	at 3s refund 2 [as b] [slots 1s]   (slots: the take's instant, tiers.RefundSlots)
//	at 3s forget 20s                  (ForgetAt of the domain, relative to start; "never"; "none")
//
// Steps are for domain "a" unless "as X" names another; min defaults to the
// copies asked. Other expectations: domain N, resource N, reset D, limit N,
// window D (D a Go duration or "unbounded"). A script replays on one State
// per domain and one Global for all of them.
package tierstest
