// Package engine is the decision pipeline behind ShouldRateLimit: validate
// the request, match each descriptor against the descriptor tree, apply
// per-descriptor overrides and replaces, decide every limited descriptor in
// one store call (all or nothing), and answer in request order with the
// limit, remaining hits and reset time Envoy builds its headers from.
//
// The engine owns the clock (Options.Now) and, with issue-5 stores, the
// failure mode. It imports no gRPC: the server converts to and from protos.
package engine
