// Package rlqs is the Rate Limit Quota Service's pipeline, beside the RLS
// pipeline of internal/engine and on its descriptor tree: it turns the usage
// reports of Envoy streams into quota assignments. It knows no gRPC or
// protobuf (server/rlqs.go speaks the wire).
//
// A stream (one Envoy's rate_limit_quota filter) reports, per bucket, the
// requests it allowed and denied. A bucket id (a map of strings) resolves,
// its entries sorted by key, through the RLS domain's descriptor tree to a
// rule and a Charon domain: a budget of the rule's limit per its window.
// Every Interval, Tick splits each budget among the streams that report it
// with fairshare.Allocate, through a sharestore.Store (in memory, or Redis
// for replicas sharing one budget), and queues on each stream the
// assignments that changed beyond the tolerance or are due to be renewed,
// waking each stream once, so that its actions go out in one response. A
// budget whose members and demands did not change since its last split has
// its leases renewed instead, when the store can (sharestore.Renewer): with
// thousands of streams, most ticks split nothing. A bucket seen for the
// first time is allocated at once, so a new Envoy gets a starting share
// within its first report.
//
// An unchanged assignment is sent again at the latest by the first tick
// within an interval and a half of its expiry. Assignments first sent
// together (every stream's after a start) would otherwise all fall due on
// one tick, again and again: each stream renews on the ticks of its own
// phase, earlier when such a tick comes first, so that the renewals spread
// evenly over the ticks and a stream's still go out in one response (see
// renewal).
//
// A report of known buckets takes only its stream's lock: thousands of
// streams must not queue on one mutex (see docs/performance.md, RLQS).
//
// The clock is Options.Now; Tick may be called by hand (tests) instead of
// Run.
package rlqs
