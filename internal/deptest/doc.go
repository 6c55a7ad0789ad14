// Package deptest holds no code: its test is the module's one table of which
// packages may import which, checked over `go list -deps -json` of every
// package of the module (test files aside).
//
// The rules, in short: tiers and copylog import only the standard library,
// and within it no clock, randomness, I/O or goroutines (a Lua script mirrors
// them, so every result depends on the arguments alone); descriptors builds
// on them alone; stores import the pure packages for their state types;
// internal/engine imports no store implementation (the caller hands it one)
// and nothing of gRPC or protobuf; only server, client, cmd/charon and the
// generated api/charon/v1 touch protos; client imports only the charon.v1
// API of this module; test-support packages are imported by tests alone.
//
// A new package, or a new import between packages of the module, needs a
// line in the table; the test names what is missing.
package deptest
