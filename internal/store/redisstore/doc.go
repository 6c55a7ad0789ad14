// Package redisstore is the Redis implementation of store.Store: any number
// of Charon processes sharing one Redis (single node, Sentinel or Cluster)
// enforce one set of limits, with the same decisions as package tiers and
// store.Apply.
//
// # One function call per decision
//
// Decide calls the decide library, an embedded Redis 7 function library
// (FCALL; Redis 7.0 or later is required), written in five files that are
// one Lua chunk (function.go): tiers.lua ports package tiers, pace.lua its
// reservations (tiers/reserve.go), state.lua
// the stored forms, fastpaths.lua the fast paths (below), apply.lua
// store.Apply with the two-step's lock modes and the batch function. Its
// library and function names carry a hash of the code (charon_<hash>,
// charon_decide_<hash>), so processes of different versions sharing one
// Redis each call their own code; the
// libraries of old versions stay loaded until FUNCTION DELETE. When Redis
// answers that it does not have the function (after a restart without
// persistence, a FUNCTION FLUSH, a new Cluster master), Decide loads it
// (FUNCTION LOAD REPLACE, on every master of a Cluster) and calls it again;
// Store.Load does the same ahead of the first call. The Redis user needs
// the FUNCTION and FCALL commands. The library implements the
// algorithms of package tiers (burst tiers with hard and global limits,
// bucketed hit logs, token bucket, fixed window; Peek, Request, Refund,
// RetryAfter, ResetAfter, Remaining, ForgetAt) and store.Apply over all the
// items of the call: one round trip per Decide when the call's keys are in
// one slot, which is always the case on a single node or with Sentinel.
//
// # Pipelining
//
// Concurrent calls are pipelined: each FCALL (every script call of a
// Decide, the two-step's included) goes to a queue served by
// Options.Pipelines dispatcher goroutines (DefaultPipelines, or
// DefaultClusterPipelines on a Cluster; started by NewWithClient, stopped by Close). A dispatcher takes every call queued while its
// previous pipeline was in flight (up to 128; no timer, so a lone call
// goes at once) and answers each caller. On a single Redis (or Sentinel)
// two or more calls go as one FCALL of the library's batch function
// (charon_batch_<hash>), which makes each call in order exactly as its own
// FCALL would (on Redis's clock, all at one instant: the batch is one
// atomic step) and answers each call's reply, or the error of a call whose
// code failed without failing the others (TestBatchFunction): Redis pays
// for one command and one function call per batch instead of per call
// (about 6% of its time per decision with three fixed windows). On a
// Cluster (runNodes) the calls are grouped by the master serving their
// slot (the client's slot map) and each master with two or more gets one
// FCALL of charon_xbatch_<hash>, registered with allow-cross-slot-keys:
// a function may touch keys of several slots of its node, but an FCALL's
// declared keys must share one slot (CROSSSLOT), so the keys travel in
// ARGV. A call whose slot the master does not serve, or serves while it
// migrates, is not made: the batch function first checks its lock keys
// (EXISTS, which is also the Cluster's lock check) and that check fails
// before anything is written; such calls, and those of a batch Redis
// refused as a whole, go again as their own FCALLs through the Cluster
// client, which follows MOVED and ASK (TestNodeBatch, with a slot moved
// behind the client's back and one migrating; TestNodeBatchNodeDown). The
// masters' batches go at once; the others (one call for a master) go as a
// go-redis pipeline of FCALLs. Either way Redis and the Go side pay one
// read and one write per batch. A pipeline lives until the latest deadline of
// its callers (none when one has none; go-redis' read and write timeouts
// still apply). A caller whose context ends gets its error at once (its
// FCALL may still run, as with any call that times out); a call whose
// context ended before its batch was sent is not sent (store.ErrNotSent),
// and is stuck (store.ErrStuck, evidence that Redis is not answering) when
// every dispatcher had a batch in flight, sent before the call was queued,
// all the while. Release makes every waiting call give up at once (the
// resilient wrapper's breaker does when it opens); the dispatchers still
// read the replies of the released calls and give back their grants.
// A call whose reply comes after its caller gave up (a late reply) is
// given back on the refunder's round trip, off the dispatchers' path: with
// the exact undo of calls spanning slots (mode 8) when every take item of
// the call can be (undoableTake: a fixed window, a plain rate_limit), so
// that the calls applied meanwhile keep their hits; otherwise refunded
// (tiers.Refund, the newest hits). A reservation (pacing) that Redis
// granted is given back as the engine gives back a wait its caller left:
// Store.GiveBack's call of store.Reserved, for the instant its reply
// answered, made by the same encoder from a copy of its items taken when
// its caller gave up; a late reservation's give-back was applied, nothing
// more is sent. Store.LateGrants counts them (TestLateUndoExact,
// TestLateRefundNotUndoable, TestLateReservationGivenBack).
// When Redis answers
// "Function not found" inside a pipeline, the dispatcher loads the
// function and sends those calls again. Pipelines < 0 turns the
// dispatchers off: each call then sends its FCALL on its own pooled
// connection.
//
// # Cost
//
// What a decision costs Redis is its Lua work, so the library keeps it
// small. The general code (general in apply.lua: store.Apply's steps over
// tables of items, groups and states) decides any call, with the groups
// the call's store.Plan makes: Decide makes the plan once and sends it
// after the items (per item its group's leader and the leader of the first
// group sharing its global state), so the Lua derives no group, and the
// Cluster paths below read the same plan; a fast path is
// that code written out for one common call, with the same answers, states
// and expiry times. Each is opened by one line that a test cuts off (makes
// "if false then") to hold the path equal to the general code on random
// calls, and each stays only while TestFastPathCost (CHARON_COST_ROUNDS
// set) measures that it saves at least 20% of Redis' time per call: the
// library and a copy without the path alternate, ABBA, on the path's
// workload, and the saving is the median of the rounds' savings of Redis'
// CPU per FCALL (docs/performance.md has the figures, and those of INFO
// commandstats' time per FCALL):
//
//   - single (apply.lua): a call of one take item, the common call and
//     the commit of a Cluster two-step's slot holding one item. It
//     specialises store.Apply for one item, which reduces to one
//     tiers.Request (no Peek, no grouping), and leads to the one-tier and
//     fixed paths. TestSinglePath. Saving on a policy those paths do not
//     take (one tier with a hard limit): 29%.
//   - one-tier (one1 in fastpaths.lua): such a call on one tier with no
//     hard or global limit (every plain rate_limit). It specialises
//     tiers.Request (decideTiers, applyTiers, ForgetAt and the state's
//     encoding written out for one tier): it decides a grant on the stored
//     string and makes the new one in one concatenation, no table per
//     call; anything else (a rejection, a tier in cooldown, more tiers)
//     goes on to decide with the string already read. TestOneTierPath.
//     Saving: 41%.
//   - fixed (fixed1): such a call on a fixed window. It specialises
//     tiers.Request (decideFixed) counting in place: one INCRBY, taking
//     back what it does not grant. TestFixedPath. Saving: 39%.
//   - peek (one1 with peek, and fixed0): a two-step's prepare of a slot
//     holding one take item on one tier or a fixed window. It specialises
//     store.Apply's prediction, tiers.Peek, writing nothing but the lock.
//     TestPeekPath. Saving: 46% (one tier), 42% (fixed window).
//   - many (fastpaths.lua): a call of several take items on distinct keys,
//     each one tier or a fixed window, all granted (Envoy's several plain
//     descriptors). It specialises store.Apply, which reduces to one
//     tiers.Request per item (no refund, each item its own group, no global
//     room shared, every Peek granting): one1 and fixed1 decide each item,
//     the writes held until every item is granted (else the general code
//     decides, nothing written). TestManyPath. Saving: 53% (three one-tier
//     items), 59% (three fixed windows).
//
// The call's numbers and the reply are big-endian doubles read and written
// with Redis' struct library (no table); policies travel as ARGV, msgpack
// arrays of integers encoded once per *tiers.Policy on the Go side (a
// cache keyed by pointer) and decoded once by the library (a cache keyed
// by their encoding); the scratch tables of a decision are made once, at
// load. A tiers or global state is one string of big-endian doubles, a
// header (each log's hits and number of records) and then the logs'
// 16-byte records (start, count): doubles hold a µs timestamp exactly, and
// the one-tier path reads only the header and the records it needs (the
// expired ones at a log's head, the newest). Inside Redis' Lua every
// string a call makes costs a pass over its bytes (Lua hashes them), so a
// state's cost is its bytes times the copies a call makes of them: the
// reply of GET, the kept records, the new state. A fixed window's state is
// its count, a decimal integer at a key expiring at the window's end (or
// sooner, at MaxTTL): a call of fixed windows counts each with one INCRBY
// (which reads the count), takes back what it does not grant, and writes
// an expiry only when a count starts a window; the key's expiry tells
// which window a count is of, read (PEXPIRETIME) only when a key being
// alive does not tell it (fixed-window states of the earlier msgpack
// layout are read and replaced, TestFixedEarlierLayout). Token bucket
// states, five numbers (what the bucket owes and the unit it is kept in,
// so that a new capacity or refill applies to it), are msgpack arrays. Blobs of earlier layouts
// (msgpack tiers and global states) read as fresh states
// (TestEarlierLayout): the sliding windows of a store shared across such an
// upgrade start afresh once. FuzzBlobInts fuzzes Inspect's decoder of them.
// BenchmarkScriptCost, TestScriptCostBench (with CHARON_COST_ROUNDS set) and
// BenchmarkDecide report Redis' time per decision (INFO commandstats: the
// FCALLs' time over the decisions, a batch making several).
//
// # Differential tests, per part
//
// The library is held equal to the Go code it ports part by part:
// TestTiersPart runs the tiers part alone (tiers.lua and state.lua with a
// test harness function, testdata/tiers_harness.lua) against package
// tiers, operation by operation on the same states; TestApplyPart runs
// random multi-item traces through the store against store.Apply over
// tiers (storetest.Model) and memstore, with a second Redis whose library
// has every fast path cut off, so that the general code is checked on
// every call and not only on those the fast paths leave to it
// (TestApplyPartCluster: the same over a Cluster); the fast paths have
// theirs (above).
//
// # Clock
//
// With ClockRedis (the default) the function reads redis.call('TIME') (allowed
// in Redis 7, which replicates functions by their effects): no extra round trip,
// and every process decides on the master's clock whatever the skew of its
// host. ClockCaller uses Decide's now instead (tests, differential replays).
//
// # Keys and expiry
//
// See keys.go for the layout: a resource with a global limit keeps its
// domains and its global key in one slot ({resource}); other pairs are
// tagged per (resource, domain) and spread over the Cluster. A key holds
// the shape of the pair's policy (store.Key.PolicyID), never its limits:
// new limits read the counts made under the old ones.
// Every key written gets an absolute expiry (SET ... PXAT) at its
// tiers.ForgetAt, capped at now plus Options.MaxTTL (so no key lives without
// a TTL, even a state tiers would keep for ever); a state whose ForgetAt is
// zero (equivalent to a fresh one) expires at now, which deletes it at once
// on Redis's clock.
//
// # Calls spanning Cluster slots
//
// A call whose keys are in several slots keeps the all-or-nothing contract
// in one round trip per slot when every grant it may make can be given back
// exactly (undoable: fixed windows, one tier active for ever without hard
// or global limit, post-paid items, refunds): every slot decides and
// applies at once, and when a slot rejects, the slots that granted give
// back what they committed with a second script call (mode 8, undo in
// apply.lua), described at Store.oneTrip. TestDifferentialClusterOneTrip
// holds the result equal to store.Apply call after call, TestClusterConcurrent
// keeps every hit exact under concurrent calls on both clocks, and
// TestOneTripMasterKilled and TestOneTripUndoFails say what a failed
// give-back leaves. Store.Undone counts the give-backs (exported as
// charon_redis_slot_undos_total).
//
// Other calls spanning slots
// take a two-step described at Store.twoStep: lock and predict per slot,
// then commit or abort every slot. Each step sends its scripts to all the
// slots at once, so the call costs two round trips (three when its
// prepares were slow and it seals its locks) and two scripts per slot; a
// slot that holds one take item is prepared and committed by the one-item
// code. A slot found locked is prepared again a few times, keeping the
// other locks; then the call releases them all and retries after a short
// jittered wait (ErrBusy after about a second of retries or when the
// context ends). One-slot calls that meet locked keys retry the same way.
//
// # Errors
//
// Decide returns store.ErrClosed after Close, store.ErrBadItem for items it
// cannot decide (nothing is sent), and otherwise the Redis error, wrapped:
// a call whose reply was lost may have run.
//
// # Connections and quiescence
//
// The store takes a go-redis client (NewWithClient) and never closes it:
// package redisconn opens Charon's, from a URL, with its credentials, TLS
// and the way a connection fails. Settle waits until no late reply and no
// refund of one is pending (a test's way to wait for the store, not for a
// duration).
package redisstore
