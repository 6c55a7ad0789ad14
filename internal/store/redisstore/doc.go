// Package redisstore is the Redis implementation of store.Store: any number
// of Charon processes sharing one Redis (single node, Sentinel or Cluster)
// enforce one set of limits, with the decisions of package tiers and
// store.Apply.
//
// The package is a port and a transport. The port is the decide library, a
// Redis 7 function library (FCALL) that runs store.Apply over package tiers
// inside Redis, so that a decision is one atomic step where the state is,
// with no retry on a hot key. It is written in five Lua files, split where
// the Go code it ports splits (function.go): tiers.lua ports package tiers,
// pace.lua its reservations, state.lua the stored forms, fastpaths.lua the
// general code written out for common calls, apply.lua store.Apply with the
// Cluster's lock modes, the replies and the batch functions. Each part is
// held equal to the Go it ports by a differential test on random traces, and
// each fast path to the general code. The transport is the Go side: it lays
// a call's items out as one FCALL per Cluster slot, sends the FCALLs of
// concurrent calls together, and reads the replies back as tiers.Decision
// values.
//
// # How a call flows
//
//  1. Decide (Reserve, GiveBack) checks the items and prepares a call
//     (call.prepare): each item's keys (keys.go) and Cluster slot, its
//     policy's encoding (a msgpack array of the policy's compact form,
//     encode.go, made once per policy), and the items' store.Plan, the
//     groups the library decides by.
//  2. call.command lays the call out as an FCALL of the decide function:
//     the keys, the header (ARGV[1], encode.go's header: the mode, the
//     instant, and per item its key, policy, hits, minimum, flags and
//     group), then the policies.
//  3. fcall hands the FCALL to a dispatcher (pipeline.go): a goroutine that
//     sends at once every FCALL queued while its previous batch was in
//     flight, with no timer, and answers each caller. On a single Redis the
//     batch is one FCALL of the library's batch function; on a Cluster, one
//     per master serving two or more of them (nodebatch.go), the others a
//     pipeline. A batch function makes each call as its own FCALL would, so
//     batching changes what Redis pays, never an answer.
//  4. In Redis the library reads the header, loads the states, decides as
//     store.Apply does (on a fast path when the call is a common one),
//     writes the states back with their expiry, and answers each item's
//     decision, which call.read decodes into the caller's out.
//
// A call whose keys share a Cluster slot (always on a single node or with
// Sentinel) is that one round trip. The library is named after a hash of its
// code (charon_<hash>), so that processes of different versions sharing one
// Redis each call their own; when Redis answers that it does not have it
// (a restart without persistence, FUNCTION FLUSH, a new master), the store
// loads it on every master and sends the call again. Load and Ping do so
// ahead of the first call. The Redis user needs FUNCTION and FCALL.
//
// # Calls spanning Cluster slots
//
// A call whose keys are in several slots stays all or nothing. When every
// grant it may make can be given back exactly (undoable: fixed windows,
// plain one-tier limits, post-paid items, refunds), every slot decides and
// applies at once, and when one rejects, the slots that granted give back
// what they committed before the call answers (oneTrip): one round trip,
// two when a slot rejects. Any other call takes the two-step (twoStep):
// every slot locks its keys and predicts, then every slot commits, or
// aborts when a group was rejected; two round trips, three when the
// prepares were slow and the locks are sealed before the commit. A slot
// found locked by another call is prepared again a few times, then the call
// releases its locks and starts over (ErrBusy when that lasts). On Redis's
// clock a reservation must keep its keys in one slot (each master reads its
// own clock): store.ErrCannotReserve otherwise.
//
// # When a caller leaves
//
// A caller whose context ends, or whom Release lets go (the resilient
// wrapper's breaker), stops waiting at once. A call not yet sent is not
// sent (store.ErrNotSent; store.ErrStuck as well when every dispatcher
// was waiting for Redis all the while). A call already sent may still be
// applied: its dispatcher reads the reply up to lateReplyWait past the
// batch's deadlines, and what Redis granted is given back (giveback.go),
// so that Redis counts no hit its caller was not told of. The same
// give-back serves the slots of a call spanning slots that another slot
// rejected, or that failed: one function makes it from the command the call
// sent and Redis' reply, the exact undo where every grant can be undone, a
// refund otherwise, for a reservation the FCALL GiveBack makes. LateGrants,
// LateLost and Undone count them (package redisbackend exports them).
//
// # Clock
//
// With ClockRedis (the default) the library reads the master's TIME (Redis 7
// replicates functions by their effects): no extra round trip, and every
// process decides on the master's clock whatever the skew of its host; a
// batch decides all its calls at one instant. ClockCaller uses the now
// passed to Decide (tests, differential replays).
//
// # Keys and expiry
//
// A resource with a global limit keeps its domains and its global state in
// one slot ({resource}); other pairs are tagged per (resource, domain) and
// spread over the Cluster (keys.go). A key names the shape of the pair's
// policy (store.Key.PolicyID), never its limits: new limits read the counts
// made under the old ones. Every key written expires (SET ... PXAT) at its
// tiers.ForgetAt, capped at now plus Options.MaxTTL. A tiers or global
// state is a string of big-endian doubles (its logs' buckets), a fixed
// window's state its count, a decimal integer whose key expires at the
// window's end, a token bucket's a msgpack array; a state of an earlier
// layout reads as a fresh one. Inspect decodes them for package tiers'
// View.
//
// # Errors
//
// Decide returns store.ErrClosed after Close, store.ErrBadItem for items it
// cannot decide (nothing is sent), and otherwise the Redis error, wrapped
// (with store.ErrReplied when Redis answered about the call's data): a call
// whose reply was lost may have been applied.
//
// # Connections, closing and quiescence
//
// The store takes a go-redis client (NewWithClient) and never closes it:
// package redisconn opens Charon's. Close stops the dispatchers once their
// batches are answered and returns when the give-backs and releases they or
// the calls started are done. Settle waits until nothing the store sent is
// pending: a test's way to wait for the store rather than for a duration.
//
// What the library costs Redis, what each fast path saves and the tests
// that hold each part and path equal to the Go code are in
// docs/performance.md ("The decide library's fast paths").
package redisstore
