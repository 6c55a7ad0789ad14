// Package rlqs is the Rate Limit Quota Service's pipeline, beside the RLS
// pipeline of internal/engine and on its descriptor tree: it turns the usage
// reports of Envoy streams into quota assignments. It knows no gRPC or
// protobuf (service/rlqs speaks the wire).
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
// Envoy's filter reports every 5 s, whatever its reporting_interval says,
// with elapsed times in whole seconds, and its requests arrive at random:
// a small Envoy's counts vary by a sixth from one report to the next. A
// bucket's demand is therefore an estimate over its reports (the time they
// cover measured here, within the whole seconds they state), and the
// demand it claims in the split moves only when the estimate leaves the
// band of its noise and of the tolerance, or when the Envoy, its claim met,
// still ran dry (demand.go): a split that followed every report would send
// a new assignment, a new full token bucket in Envoy, at every report. An
// Envoy whose share meets its claim holds a bucket deep enough for the
// randomness of its arrivals (MetBurst); one held short of its demand a
// quarter of a second's share. A limit per second is split in tokens per
// 10 s, so that small shares are not rounded up by whole tokens per second.
//
// A report of known buckets takes only its stream's lock: thousands of
// streams must not queue on one mutex (see docs/performance.md, RLQS).
//
// The clock is Options.Now; Tick may be called by hand (tests) instead of
// Run.
package rlqs
