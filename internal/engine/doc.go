// Package engine is the decision pipeline behind ShouldRateLimit: validate
// the request, match each descriptor against the descriptor tree, apply
// per-descriptor overrides and replaces, decide every limited descriptor in
// one store call (all or nothing), and answer in request order with the
// limit, remaining hits and reset time Envoy builds its headers from.
//
// Request, the charon.v1 bulk form of ShouldRateLimit for one rate-limited
// resource, lives here too. The copy operations are a pipeline of their own
// beside this one, package holds, on the same descriptor tree (Tree). Both
// check a resource and name a bad field with package descriptors'
// ValidateResource, InputError and FieldError, so that the server maps both
// pipelines' errors in one table and holds needs nothing of this package.
//
// The engine owns the clock (Options.Now); a store failure is returned
// wrapped with ErrStore (a remote store's failure mode lives in the store,
// package resilient). The engine imports no gRPC and no store
// implementation: the server converts to and from protos, and the caller
// hands it a store.
package engine
