// Package memcopy is the in-memory copystore.Store: the copy logs of one
// process, nothing to install, lost when the process exits (a server that
// must survive a restart, or share copies with other servers, uses the
// Redis store).
//
// Resources are spread over shards by a hash of their name; each shard has
// its own mutex, held while one copylog operation runs on one of its
// resources, so the operations on a resource are serialized (linearizable)
// and resources of different shards proceed in parallel. A copy log that
// becomes empty (copylog.State.Empty) is dropped by the next Reap (not at
// once, so that a resource reserved and released in turn keeps its copy
// log); its last fencing token is kept, a few bytes per resource, and seeds
// the next copy log of that resource, so tokens keep increasing across
// holds whatever the resource went through.
//
// Leases are measured by the now the caller passes: Reap(now), called by
// the optional sweeper (Options.SweepInterval) or by the caller, expires
// lapsed holds and transfers of every resource; every operation also reaps
// its own resource first. Stats reports gauges and counters for metrics.
package memcopy
