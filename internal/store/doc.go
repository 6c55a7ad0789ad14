// Package store defines the contract between the decision pipeline and the
// places where rate-limit state lives: the in-memory store (memstore), the
// Redis store (redisstore), and the conformance suite every store runs
// (storetest).
//
// A Store decides a whole RLS request in one call: every descriptor of the
// request is one Item, and the call is all-or-nothing across them. The
// procedure is written once, in Go, by Apply; a store keeps the state, holds
// whatever lock or script makes the call atomic, and runs Apply (or, for
// Redis, a script kept equal to it by a differential test). The grouping of
// a call's items that Apply decides by (items sharing a Key form one group;
// groups of one resource's global limit share its room) is written once
// too, by Plan: a store makes the plan once per Decide, and every step
// that needs the groups reads it, the Redis store's script included.
package store
