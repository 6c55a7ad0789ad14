// Package storetest is the conformance suite every store.Store runs:
// grant/reject sequences checked against the tiers package's own answers,
// all-or-nothing across items, refunds, shadow items, global counts shared
// across domains, policy changes, concurrency (run it with -race), random
// traces checked against Model, the reference store, and package tiers'
// scenario scripts (tiers/testdata), whose expectations every store meets.
//
// A store's test calls Run with a constructor of empty stores. Trace and
// RandomItem draw the random calls of the suite's traces, for a store's own
// tests as well.
package storetest
