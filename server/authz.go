package server

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/charonlimit/charon/internal/authz"
	"github.com/charonlimit/charon/internal/tlsconfig"
)

// authorize refuses a call the table does not allow its client, by the
// identities of the client's verified certificate.
func (s *Server) authorize(ctx context.Context, method string) error {
	var ids []string
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.VerifiedChains) > 0 && len(ti.State.VerifiedChains[0]) > 0 {
			ids = tlsconfig.Identities(ti.State.VerifiedChains[0][0])
		}
	}
	if s.opts.Authz.Allowed(ids, method) {
		return nil
	}
	s.metrics.authzDenied.WithLabelValues(authz.GroupOf(method)).Inc()
	if len(ids) == 0 {
		return status.Errorf(codes.PermissionDenied, "charon: %s needs a client certificate", method)
	}
	return status.Errorf(codes.PermissionDenied, "charon: client %v may not call %s", ids, method)
}

func (s *Server) authzUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := s.authorize(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (s *Server) authzStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := s.authorize(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return handler(srv, ss)
}
