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
// assignments that changed beyond the tolerance or are due to be renewed. A
// bucket seen for the first time is allocated at once, so a new Envoy gets a
// starting share within its first report.
//
// The clock is Options.Now; Tick may be called by hand (tests) instead of
// Run.
package rlqs
