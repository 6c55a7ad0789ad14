// Package charonv1 is the generated Go code of the charon.v1 API
// (charon.proto): the Charon service's messages, its client and its server
// interface. Regenerate it with `make generate` (scripts/generate.sh); only
// this file, metadata.go (the metadata a call may carry) and charon.proto
// are written by hand.
//
// Messages follow google.golang.org/protobuf's rules: not safe for
// concurrent mutation, and the zero value of a message is an empty message.
package charonv1
