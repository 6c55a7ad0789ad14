// Package engine is the decision pipeline behind ShouldRateLimit: validate
// the request, match each descriptor against the descriptor tree, apply
// per-descriptor overrides and replaces, decide every limited descriptor in
// one store call (all or nothing), and answer in request order with the
// limit, remaining hits and reset time Envoy builds its headers from.
//
// The charon.v1 operations live here too: Request, the bulk form of
// ShouldRateLimit for one rate-limited resource, and the copy operations
// (Reserve, Release, Transfer, Seize, KeepAlive, ReleaseSession) over
// Options.Copies, a copystore.Store. Hold and transfer ids name their
// resource (NewID, ResourceOf), so every operation after Reserve finds its
// copy log from the id alone. Copy store failures are returned, never
// answered from local state.
//
// The engine owns the clock (Options.Now) and, with issue-5 stores, the
// failure mode. It imports no gRPC: the server converts to and from protos.
package engine
