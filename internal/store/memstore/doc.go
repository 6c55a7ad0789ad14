// Package memstore is the in-memory store.Store: one process, nothing to
// install. State is sharded by a hash of its key; a call locks the shards of
// all its items in ascending order, so each (resource, domain) pair and each
// resource's global state sees one decision at a time and multi-descriptor
// requests are atomic. The number of tracked keys is bounded (least recently
// used evicted, counted) and state is forgotten once tiers.ForgetAt says
// forgetting cannot change a decision.
package memstore
