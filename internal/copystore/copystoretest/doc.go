// Package copystoretest is the conformance suite every copystore.Store
// runs: domain, global and group limits with overrides, the largest grant
// in [min, copies] or nothing, partial and over-releases, unknown holds and
// transfers, transfers and seizes, leases lapsing at exactly their expiry,
// keep-alives, session deaths, idempotent reserves, fencing tokens that
// keep increasing when a resource empties, the periodic reaper, random
// traces whose every answer must equal copylog's own (a differential test
// with time moving, so leases and records lapse mid-trace), concurrency
// (run it with -race) and a linearizability check of
// concurrent histories against a sequential semaphore model (Porcupine).
//
// The suite passes now explicitly to every operation and expects the store
// to measure leases by it; it uses instants after T0 and fresh resource
// names in every subtest, so stores that share a backend (one Redis) across
// subtests do not see each other's copies. A store's test calls Run with a
// constructor of stores.
package copystoretest
