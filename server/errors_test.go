package server

import (
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/charonlimit/charon/copylog"
	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/holds"
)

func TestGRPCErrorCopyCodes(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code codes.Code
	}{
		{copylog.ErrHoldExists, codes.Aborted},
		{copylog.ErrBadMin, codes.InvalidArgument},
		{holds.ErrNoCopyStore, codes.Unavailable},
		{&descriptors.FieldError{Field: "copies", Err: copylog.ErrOverRelease}, codes.OutOfRange},
		{errors.New("other"), codes.Internal},
	} {
		if got := status.Code(GRPCError(tc.err)); got != tc.code {
			t.Errorf("GRPCError(%v) = %v, want %v", tc.err, got, tc.code)
		}
	}
}
