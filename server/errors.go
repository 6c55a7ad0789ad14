package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/charonlimit/charon/copylog"
	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/copystore"
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/internal/holds"
	"github.com/charonlimit/charon/internal/rlqs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// errNoConfig answers a request while Options.WaitForConfig waits for the
// first configuration.
var errNoConfig = errors.New("server: no configuration yet")

// noConfigError is errNoConfig saying what it waits for
// (Options.WaitingFor).
func noConfigError(waitingFor string) error {
	if waitingFor == "" {
		return errNoConfig
	}
	return fmt.Errorf("%w: %s", errNoConfig, waitingFor)
}

// GRPCError maps an error of a pipeline (engine, holds, rlqs, the stores)
// to a gRPC status error. It is the only place where errors become gRPC
// codes: every service answers with it.
func GRPCError(err error) error {
	if err == nil {
		return nil
	}
	var in *descriptors.InputError
	switch {
	case errors.As(err, &in):
		return status.Error(codes.InvalidArgument, in.Error())
	case errors.Is(err, rlqs.ErrInput):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, rlqs.ErrTooManyBuckets):
		// A filter's bucket matchers that make a bucket per request value
		// without bound; the stream ends rather than the server's memory.
		return status.Error(codes.ResourceExhausted, err.Error())
	case errors.Is(err, engine.ErrStore), errors.Is(err, copystore.ErrUnavailable), errors.Is(err, holds.ErrNoCopyStore),
		errors.Is(err, errNoConfig):
		// UNAVAILABLE lets Envoy's failure_mode_deny, or a client's degraded
		// mode, decide; copies never fall back to local state. Before its
		// first configuration the server answers as envoyproxy/ratelimit's
		// closed port would (it does not listen until then).
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, descriptors.ErrUnknownResource), errors.Is(err, copylog.ErrUnknownHold), errors.Is(err, copylog.ErrUnknownTransfer):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, engine.ErrCopyLimited), errors.Is(err, holds.ErrRateLimited):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, copylog.ErrOverRelease), errors.Is(err, copylog.ErrOverTransfer):
		return status.Error(codes.OutOfRange, err.Error())
	case errors.Is(err, copylog.ErrBadCopies), errors.Is(err, copylog.ErrBadMin), errors.Is(err, copylog.ErrBadLease), errors.Is(err, copylog.ErrBadID):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, copylog.ErrRequestIDReused):
		return status.Error(codes.AlreadyExists, err.Error())
	case errors.Is(err, copylog.ErrHoldExists), errors.Is(err, copylog.ErrTransferExists):
		// Two random 128-bit ids met: retrying mints new ones.
		return status.Error(codes.Aborted, err.Error())
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

// HTTPError answers err on an HTTP endpoint as the gRPC services would
// (GRPCError's message), with the HTTP status of its code.
func HTTPError(w http.ResponseWriter, err error) {
	st := status.Convert(GRPCError(err))
	code := http.StatusInternalServerError
	switch st.Code() {
	case codes.InvalidArgument:
		code = http.StatusBadRequest
	case codes.NotFound:
		code = http.StatusNotFound
	case codes.Unavailable:
		code = http.StatusServiceUnavailable
	case codes.Unimplemented:
		code = http.StatusNotImplemented
	case codes.DeadlineExceeded:
		code = http.StatusGatewayTimeout
	}
	http.Error(w, st.Message(), code)
}
