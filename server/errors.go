package server

import (
	"context"
	"errors"

	"github.com/charonlimit/charon/internal/engine"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// errNoResponse is an engine that answered neither a response nor an error.
var errNoResponse = errors.New("server: engine returned no response")

// grpcError maps an error from the decision path to a gRPC status error. It is
// the only place where errors become gRPC codes.
func grpcError(err error) error {
	if err == nil {
		return nil
	}
	var in *engine.InputError
	switch {
	case errors.As(err, &in):
		return status.Error(codes.InvalidArgument, in.Error())
	case errors.Is(err, engine.ErrStore):
		// UNAVAILABLE lets Envoy's failure_mode_deny decide.
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	if s, ok := status.FromError(err); ok {
		return s.Err()
	}
	return status.Error(codes.Internal, err.Error())
}
