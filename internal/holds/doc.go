// Package holds is the pipeline of the charon.v1 copy operations (Reserve,
// Release, Transfer, Seize, KeepAlive, the sessions' renewal and release),
// beside the RLS pipeline of internal/engine and on its descriptor tree
// (Options.Tree): it resolves a resource to its copy limit and runs each
// operation on the copy log of that resource in a copystore.Store (memory
// or Redis), whose procedures are copylog's.
//
// Hold and transfer ids name their resource (NewID, ResourceOf), so every
// operation after Reserve finds its copy log from the id alone, on any
// replica. Copy store failures are returned, never answered from local
// state. A resource is checked, and a bad field named, as engine.Request
// does it, with package descriptors' ValidateResource, InputError,
// FieldError and ErrUnknownResource: the server maps both pipelines' errors
// in one table. The Broker owns its clock (Options.Now); it imports no gRPC,
// no copy store implementation and not internal/engine.
package holds
