// Package escrowsim simulates escrow leases (package internal/escrow) in
// one process, in real time: replicas, each an escrow.Store running its own
// loop on the real clock, grouped in regions, deciding one sliding-window
// rule whose budget lives in a home store (the memory store). It is the
// verb `charon escrow-sim` and its tests.
//
// Each region reaches the home through a link of its own that adds a round
// trip of latency to every call (half on the way there, half on the way
// back) and can be cut: a call that arrives while its link is cut fails,
// one whose answer returns while it is cut is decided but its answer lost.
// The home decides on its own clock when a call arrives, one call at a
// time, as a single Redis does. Every replica decides the requests of pairs
// it does not lease on the home through its region's link (the shared
// path); it takes its leases from the home through that link too, or,
// with Options.Pools, from its region's pool (escrow.NewMemPool), into
// which its escrow.Region leases slices of the home's budget through the
// link, as `charon serve --escrow-home` does; its fair shares come from a
// share store of its region. A replica reaches its region's pool and
// share store without latency.
//
// Clients send requests to replicas with skew (one replica gets most of
// them), the heavy replica may change at Options.Shift, a replica (the
// heavy one at that instant) may be killed at Options.Kill: it gets no more
// requests (they go to the others), and every call it and its Region make
// fails from then on, so it gives nothing back, as a process that died:
// its leases and slices stay counted until they expire. A region may be cut off from the home
// for a while.
//
// What it measures, from the record of every decision: each grant's
// instant (the home's instant for a grant on the shared path, the
// replica's for a grant from a lease), and so the most hits granted in any
// window: over a window of the rule's length less the store's bucket width
// (package tiers counts a window of more than 64 hits in 64 buckets, which
// forgets a hit up to that width early; the store promises the limit over
// that shortened window, escrow or not); false rejections (a request
// rejected while the grants of the window before it were fewer than the
// limit less a margin); calls to the home and to the regions per decision;
// each replica's grants and fair share per window; decision latency.
package escrowsim
