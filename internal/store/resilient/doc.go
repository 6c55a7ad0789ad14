// Package resilient wraps a remote store.Store (the Redis store) so that a
// slow or unreachable remote never stalls a decision, and so that hot keys
// over their limit stop costing round trips.
//
// # Deadline and circuit breaker
//
// Every remote Decide runs under a deadline: the caller's, less a margin
// kept for the failure mode's answer (the larger of Options.Margin and
// Options.MarginShare of the time left: at Envoy's 20 ms, 15 ms for the
// remote), or Options.Timeout (DefaultTimeout) when the caller has none. The
// share is what holds on a machine whose cores are all busy, where the
// answering goroutine waits for a core after the remote's deadline fires; a
// fixed 2 ms did not. Settle waits until the remote has nothing pending (a
// test's way to wait for it). The remote must honour its
// context's deadline, as go-redis does: the wrapper does not abandon a call
// running in another goroutine. A circuit breaker counts the remote's
// failures: after Options.FailureThreshold consecutive failures, or when at
// least Options.FailureRate of the calls in an Options.RateWindow failed (with
// at least Options.RateMinCalls calls), it opens; calls then go straight to
// the failure mode and do not pay the deadline. A call the remote did not
// send before its deadline (store.ErrNotSent) is not counted, unless it
// waited behind calls the remote had not answered (store.ErrStuck): that
// is counted as a timeout, so that a remote that stops answering opens the
// breaker within the first deadline of the calls queued behind the ones on
// the wire, not only on the few on the wire. When the breaker opens, a remote
// that is a Releaser (the Redis store) releases the calls still waiting for
// it, which the failure mode then answers at once instead of at their
// deadlines. Decisions never probe the
// remote: after the cool-off (Options.CoolOff) Probe pings it (the Remote's
// Ping, under its own, longer deadline, Options.ProbeTimeout), and the first
// ping that succeeds closes the breaker. The owner calls Probe several times
// per cool-off (charon serve does, every tenth of it, PINGing Redis and
// loading its function again where it is missing); a failed ping leaves the
// breaker open without another cool-off, so recovery follows the remote's
// return by about the owner's interval.
//
// A remote made of parts that fail on their own (a Sharder: a Redis
// Cluster's masters) gets a breaker per part: a call answers to the
// breakers of the parts its items go to now, goes to the failure mode
// when any is open, and counts its success or failure on each (a failure
// on every part of a call spanning parts, which cannot always be told
// apart). Each part's evidence is its own: its answers (and, for a
// ShardReplier, its replies) say whether its timeouts were slowness; a
// call not sent because it waited behind unanswered calls is not counted
// (they may have been another part's); an opening releases nothing (the
// calls waiting may be the live parts'). Probe pings each open part alone
// (PingShard) and forgets the breakers of parts the remote no longer names,
// so that when slots move (a failover, a reshard) their calls follow them
// to the breaker of the part that serves them.
//
// A timed-out remote call may have been committed by the remote (its script
// may have run after the deadline); the failure mode then decides the same
// request again, so a timeout can count a request twice, never zero times.
//
// # Failure modes
//
// When the remote call fails or the breaker is open, Options.Mode decides:
//
//   - ModeLocal (the default): a process-local memstore, created by the
//     wrapper, decides. Each process then enforces the limits on its own
//     traffic only, so each limit is divided among the replicas that share
//     the remote, as the owner last counted them while it answered
//     (SetReplicas; SharePolicy rounds each share down, at least 1): N
//     replicas together grant at most the limit, not N times it. When the
//     remote is healthy again decisions return to it (the local state is
//     kept for the next outage and bounded by Options.Local.MaxKeys).
//   - ModeOpen: every item is granted in full (Granted = Hits; refunds 0),
//     with the decision context of a pair that has no history.
//   - ModeClosed: every item but refunds is rejected, with RetryAfter the
//     rest of the cool-off (Options.CoolOff when it is over or the breaker
//     is not open); refunds are answered OK and lost.
//   - ModeUnavailable: Decide returns an error wrapping ErrUnavailable (and
//     the remote's error, or ErrBreakerOpen), which the engine wraps with
//     engine.ErrStore and the server answers with gRPC UNAVAILABLE, so that
//     Envoy's failure_mode_deny decides. Serving reports false while the
//     breaker is not closed, for the gRPC health service.
//
// # Over-limit cache
//
// When the remote rejects a pair (a non-shadow, non-refund item) with a
// positive RetryAfter T, the wrapper remembers the rejection until now+T: no
// traffic can make the pair grantable sooner, because a rejected request
// changes nothing and other requests only add hits. A later request whose
// every item is such a cached pair, asking for the same minimum (the group's
// summed Min, on which RetryAfter depends), is answered locally without a
// round trip: OK false, Granted 0, RetryAfter and ResetAfter the time left to
// now+T (exact, in whole microseconds like the tiers package), and the rest of
// the decision context as the remote gave it at the rejection (Remaining,
// TierHits, DomainHits may have moved since; this is why the conformance
// suite, which compares whole decisions, runs with the cache off). Entries with RetryAfter
// Unbounded are kept until evicted or flushed: no wait can grant them under
// that policy ID. A request with any uncached item, or with any refund, goes
// to the remote, which decides all or nothing anyway.
//
// A refund this process sees removes the refunded pair's entry, and so does
// a grant (grants can delay a pair's grant for a larger minimum); with a
// global limit both also invalidate the entries of the pair's resource
// (one domain's hits move every domain's answer). Within one process the
// cache thus answers exactly what the remote would for OK, Granted,
// RetryAfter and ResetAfter (a test replays random traces against a memstore
// to check it). Across processes two limitations remain: a refund made
// through another process cannot be seen, so this process may keep rejecting
// a pair until its cached T although the remote would grant it sooner (the
// same holds when the remote forgets state early, as evicted keys); and
// another process's grants may push the true RetryAfter later than the cached
// one (the answer is still a rejection; the client retries a little early). The cache is keyed by store.Key, and an entry
// answers only an item of the policy it was decided under: new limits on
// the same state (a request's own limit that changed) never hit entries of
// the old ones; Flush empties it when the configuration changes anyway. The cache uses the now passed to Decide; if
// the remote decides with its own clock (Redis TIME), T is still measured
// from this process's now, which is exact as long as both clocks run at the
// same rate.
//
// A post-paid pair (Overdraft) in debt is answered from the cache too,
// though a refusal of it must still debit its hits: they are summed per
// pair and sent every Options.DebtInterval (DefaultDebtInterval), in one
// remote call per pair that takes them all, whatever its answer; its
// answer (a refusal until the larger debt is repaid) replaces the entry.
// A flood against a budget in debt then costs the remote a call per pair
// per interval, not per request. What another process sees of the debt is
// late by at most the interval and that call; the debt's end moves later by
// as much (the sum is debited at the last refusal's instant). Grants are
// unchanged: a pair in debt is refused everywhere. Sums the remote surely
// did not get (breaker open, ErrNotSent) wait for the next flush; Settle
// and Close send what is summed.
//
// The cache is bounded (Options.CacheSize entries, least recently used
// evicted per shard); a hit makes no allocation.
//
// # Metrics and health
//
// Stats returns plain counters (calls per path taken, remote errors and
// timeouts, breaker state and openings, cache hits, misses, size and
// evictions) for the server to export; Serving tells the health service
// whether to report SERVING; Options.OnBreakerChange is called on every
// breaker transition.
package resilient
