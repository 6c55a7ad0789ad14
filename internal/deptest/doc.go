// Package deptest holds no code: its test is the module's one table of which
// packages may import which, checked over `go list -deps -json` of every
// package of the module (test files aside), and the floors that table
// respects.
//
// The rules, in short: tiers and copylog import only the standard library,
// and within it no clock, randomness, I/O or goroutines (a Lua script mirrors
// them, so every result depends on the arguments alone); descriptors builds
// on them alone; stores import the pure packages for their state types;
// internal/engine imports no store implementation (the caller hands it one)
// and nothing of gRPC or protobuf; only server, the services, client,
// cmd/charon and the generated api/charon/v1 (and the verbs and tools that
// call a server) touch protos; client imports only the charon.v1 API of this
// module; test-support packages are imported by tests alone.
//
// The packages stand on floors, bottom up: the pure cores and the leaves,
// the request vocabulary and the store contracts, the configuration, the
// stores and the pipelines, what builds on them, the server's lifecycle,
// the services, and cmd/charon. A package imports only from floors below
// its own: no arrow goes up, and none sideways, so the pipelines never
// import each other and neither do the services (service/rls,
// service/charon, service/rlqs), which only cmd/charon wires (and
// internal/servertest serves to tests).
//
// A new package, or a new import between packages of the module, needs a
// line in the table and a floor; the test names what is missing.
package deptest
