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
// The engine owns the clock (Options.Now); a store failure is returned
// wrapped with ErrStore (a remote store's failure mode lives in the store,
// package resilient). The engine imports no gRPC and no store
// implementation: the server converts to and from protos, and the caller
// hands it a store.
package engine
