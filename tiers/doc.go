// Package tiers implements Charon's rate-limiting algorithms as pure
// functions over values: the burst tiers of the Charon paper (SPEC §2) with
// hard and global limits, a token bucket (credit pool), and
// envoyproxy/ratelimit's calendar-aligned fixed window. It does no I/O,
// starts no goroutines and never reads the clock: the caller passes now.
//
// A store keeps one State per (resource, domain) pair and one Global per
// resource, serializes the decisions that touch them, and calls Request (or
// Peek, then Request, to grant several descriptors all or nothing). Refund
// gives hits back; ForgetAt tells when a state may be dropped.
//
// # Time
//
// Inside the package time is an int64 count of microseconds since the Unix
// epoch (now.UnixMicro()), and durations are truncated to whole
// microseconds. Every quantity is an integer below 2^53 (see MaxLimit,
// MaxDuration, MaxTiers), so a Lua 5.1 script, whose numbers are doubles, can
// reproduce every decision exactly (Unbounded is math.huge there). The
// description below is the contract such a script follows; "t" is now in µs.
//
// # Burst tiers (KindTiers)
//
// State, per tier i (1-based): whether it was ever entered, the instant e_i
// it was last entered, and its hit log. The domain's State also has a hit log
// of the last second; the resource's Global has one more.
//
// A hit log is a list of buckets (start, count) with strictly increasing
// starts and a width b: a hit granted at t goes into the bucket starting at
// floor(t/b)*b, or into the newest bucket when that one starts at or after
// floor(t/b)*b (time going backwards is counted late, never early). A log
// for a window of w counts at t the buckets whose start s satisfies s > t-w;
// committing a grant first drops the buckets with s <= t-w. Widths:
//
//   - a tier with limit L <= 64: b = 1 µs, i.e. exact hit timestamps (a
//     bucket is the hits of one instant);
//   - a tier with L > 64: b = ceil(W/64) µs for its window W;
//   - the per-second logs (w = 1 s): b = 1 µs when the hard (resp. global)
//     limit is 1..64, else b = 15625 µs (1 s / 64); with no limit set, b =
//     125000 µs (1 s / 8): such a log enforces nothing and only reports its
//     count (DomainHits, ResourceHits), which then covers between the
//     last 875 ms and the last second.
//
// So a log never holds more than 64 buckets (the starts counted at t are
// multiples of b in (t-w, t], at most ceil(w/b) <= 64 of them; an exact log
// holds at most L instants) and a State's memory does not grow with its
// limits. A bucketed log counts a hit only while its bucket's start is
// inside the window, so it counts at most as many hits as the exact
// timestamps would: it never rejects what the exact procedure grants from
// the same history, and its effective window is shortened by less than
// W/64 (a hit is always counted while younger than W-b+1 µs).
//
// Phases: tier i with entry e is active when t < e+A_i (also for t < e),
// in cooldown when e+A_i <= t < e+A_i+C_i, inactive otherwise or when never
// entered; sums saturate at Unbounded. The current tier c is the highest
// active tier, or 0. A request (copies k, min m, 0 <= m <= k) grants hits
// one by one as SPEC §2 says: stop when the hard limit H is set and
// domain+granted >= H, or the global limit G is set and resource+granted >=
// G; grant into c when c >= 1 and its count < L_c; otherwise burst into the
// first tier j > c that is inactive, passing over tiers in cooldown that are
// skippable and failing at one that is not; with no target stop. Granting
// in chunks gives the same result. If fewer than m are granted nothing
// changes. Otherwise tiers entered get e_j = t and an emptied log, the hits
// are added to the logs of the tiers they went into (a tier filled on the
// way gets L_j - count hits), and the granted number is added to the
// domain's and the resource's per-second logs.
//
// The decision: Remaining is the number of further single hits the same
// procedure would grant at t after the decision. RetryAfter (rejections) is
// found by evaluating the procedure for max(m, 1) hits at each instant after
// t at which the state's meaning changes (a bucket start plus its window, an
// entry plus its active period, plus its cooldown), in increasing order; the
// first instant that grants gives RetryAfter, none gives Unbounded (also
// when m > k, m > H or m > G). ResetAfter (grants) is the oldest counted
// bucket start of the current tier (t when the tier was entered by this
// request) plus its window, minus t.
//
// Refund removes the newest hits of the current tier (and as many from the
// per-second logs; a concurrency limit's, below, the oldest). ForgetAt is the latest of e_i+A_i+C_i over entered tiers
// with a finite active period, the newest bucket start plus the window for a
// first tier active for ever (Forever for a higher one), and the newest
// per-second bucket plus one second.
//
// # Concurrency limits (Concurrency)
//
// A concurrency limit is a policy of one tier of limit L and window T,
// active for ever, whose hits are slots held by requests in flight and T
// their time to live. A request takes its k slots as any request takes
// hits, all or nothing: granted while the window counts at most L - k. A
// slot is given back by a refund or frees itself when it leaves the window,
// no later than T after it was taken (and, for L > 64, whose log is kept in
// buckets of b = ceil(T/64) µs, no earlier than T - b + 1 µs after: the
// lenient direction, as for any log). A grant answers the instant its slots
// were stamped with (Decision.SlotsAt).
//
// RefundSlots(at) removes the slots of the take stamped at: from the first
// bucket that starts at or after at's, which is the take's own (a bucket
// holds slots of one age) or, when time went backwards, an older one; and
// nothing when at's bucket has left the window (the take's slots freed
// themselves). Refund, with no take named, removes the oldest slots held.
//
// The guarantee: say a request is in flight from its grant until its
// refund, or until it ends without one (its client killed). If every refund
// comes before its take's slots leave the window, then at every instant the
// requests in flight number at most L. By induction, the slots of the log,
// taken newest first, are at every age at least as many as the in-flight
// requests' slots of that age or newer: a take adds one slot to both, an
// end without refund removes a request only, a slot leaving the window is
// older than every in-flight request's, and a refund removes a slot as old
// as the refunded request's own or older, which keeps the count at every
// age. Removing the newest slot would not: with T = 10 s, A takes at 0 and
// B at 5; A's refund at 6 removing B's slot, A's leaves the window at 10
// while B still runs, and a request is granted beside B over a limit of 1.
// The refund of a request that outlived T removes nothing under
// RefundSlots, but under Refund it removes a slot of a request still in
// flight: T must exceed the longest request.
//
// Leaks: the slots of a request that ends without a refund free themselves
// T after their take, whatever other requests do, as long as refunds name
// their takes (RefundSlots never removes another request's slot but an
// older one after time went backwards). Refund, naming none, may remove an
// older leaked slot and leave the refunded request's own in its place,
// newer: the leak then lasts until that slot leaves the window, and under
// steady traffic may be passed on from request to request for longer than
// T. Refunds should name their takes.
//
// # Token bucket (KindTokenBucket)
//
// With per = Per in µs, g = gcd(Refill, per), p = per/g and r = Refill/g, a
// credit is p units and the bucket gains r units per µs, up to cap = C*p
// units. State: what the bucket owes (cap less its balance) in units at
// the instant of its last update, and the p it is kept in; a zero State is
// full. The balance at t is cap - max(0, owed - r*(t-at)) (no accrual when
// t <= at), owed being counted at most 2*cap. A request grants n = min(k, balance/p) (integer
// division) when n >= m and subtracts n*p; Remaining is the whole credits
// left; RetryAfter is ceil((max(m,1)*p - balance)/r) µs, Unbounded when m
// exceeds the capacity; ResetAfter the time to the next whole credit (0 when
// full). Refund adds credits up to the capacity.
//
// # Fixed window (KindFixedWindow)
//
// envoyproxy/ratelimit's alignment: the window holding t starts at the Unix
// time in seconds truncated to a multiple of the unit's length (second 1,
// minute 60, hour 3600, day 86400, week 604800, month 2592000 (30 days), year
// 31536000 (365 days)), in UTC. State: the window's start and count. A
// request grants min(k, L - count) when that is at least m; unlike
// envoyproxy/ratelimit, a rejected request counts nothing. RetryAfter and
// ResetAfter are the time to the window's end. Refund lowers the count, not
// below 0.
//
// # Post-paid usage (Overdraft)
//
// A policy with Overdraft counts usage that already happened (a budget paid
// after the fact, envoyproxy/ratelimit's default counting) instead of
// admitting it. A state is in debt at t when, for KindTiers, the current
// tier's window counts more than its limit, or the domain's (resource's)
// last second counts more than H (G); for a token bucket, when its balance
// is below 0; for a fixed window, when its count is above the limit. In
// debt, every request is rejected, a check of 0 hits included, and nothing
// is granted. A request that is not granted (in debt or not) debits its k
// hits all the same: KindTiers commits what the procedure could grant (the
// tiers entered on the way stay entered) and adds the rest to the log of
// the tier the walk ended in (when it ended in one) and to the per-second
// logs; a bucket's balance falls by k credits, not below minus its
// capacity; a fixed window's count grows by k. A granted request is decided
// and committed as without Overdraft, so the hits granted never exceed
// what admission would grant. A debit keeps a log within 64 live buckets
// (further debits join the newest bucket, which moves to their instant) and
// every count within 2^52.
//
// A post-paid rejection answers Remaining 0, and Request computes its
// RetryAfter (the wait until the same request, or for a check of 0 hits the
// end of the debt, would be granted) on the state after the debit; Peek,
// which changes nothing, answers the wait before it. Everything else Peek
// answers is what Request answers.
//
// # New numbers on an old state
//
// A State holds no limit of its policy: a store keeps it under the
// policy's Shape, and a policy of the same shape with other numbers reads
// it with its own (SPEC §3, counts belong to the rule). A tier's log counts
// its hits whatever the limit: a log written exact (width 1) and read with
// buckets, or the other way round, keeps its entries as they are, new hits
// joining the newest entry when it starts at or after their bucket's start,
// so an exact entry counts exactly and a bucket leniently, as above; the
// same for the per-second logs when a hard or global limit changes. A
// raised limit grants exactly the difference, a lowered one rejects until
// the count falls below it (a tier of a stack over its new limit is full:
// the next hit bursts). Entries of tiers are read under new active periods
// and cooldowns. A bucket keeps what it owes: a new capacity applies to it
// (raised by c, c more credits at once; lowered below it, a negative
// balance, what it owes counted at most 2*cap); a new refill or period
// changes p, and what it owes is converted to whole credits of the new p,
// the fraction of a credit refilling dropped (at most one credit early,
// once), the new refill applying from the last update. A window and a
// quota keep their count.
//
// # Stores and servers
//
// The package owns the numbers of a policy: Unit's Length, String and
// ParseUnit are the units' lengths and names, Micros and FromMicros the
// conversions of its time, and AppendCompact a policy's integers as a port
// of the procedure (the Redis store's function) reads them, with the
// widths, fixed-point units and lengths above already derived; FillLimits
// completes such a port's decisions with the fields that follow from the
// policy. Other packages call these rather than derive the numbers again.
//
// RetryAfter Unbounded means no wait can grant the request (a closed
// resource, or more than the policy can ever grant at once): a server should
// answer OVER_LIMIT without a reset time and a client should not retry.
package tiers
