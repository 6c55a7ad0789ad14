// Package server is the lifecycle of a Charon process on the network: the
// gRPC, HTTP, debug and metrics listeners, health (gRPC and /healthcheck),
// TLS and the authorization table's interceptors, the configuration
// directory watcher that swaps a new configuration in atomically (and
// ApplyConfig for one from xDS), the drain and graceful stop, and the
// table that maps every pipeline error to a gRPC status (GRPCError).
//
// It serves no RPC of its own but health and reflection: each service
// (service/rls, service/charon, service/rlqs) registers on the server it
// is handed (Service), and cmd/charon hands them to New. The server reads
// no clock for decisions and holds no rate state.
package server
