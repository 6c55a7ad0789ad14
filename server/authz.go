package server

import (
	"context"
	"crypto/tls"
	"net/http"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/charonlimit/charon/internal/authz"
	"github.com/charonlimit/charon/internal/tlsconfig"
)

// identities are the names of a connection's verified client certificate,
// none without one (nil state: not TLS).
func identities(cs *tls.ConnectionState) []string {
	if cs == nil || len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return nil
	}
	return tlsconfig.Identities(cs.VerifiedChains[0][0])
}

// authorize refuses a call the table does not allow its client, by the
// identities of the client's verified certificate.
func (s *Server) authorize(ctx context.Context, method string) error {
	var cs *tls.ConnectionState
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			cs = &ti.State
		}
	}
	return s.allow(identities(cs), method)
}

// allow refuses, counted, a method the table does not allow these
// identities.
func (s *Server) allow(ids []string, method string) error {
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

// httpAuthz returns what wraps an HTTP port's handlers with the table: a
// request whose verified client certificate's identities the table does not
// allow the handler's name (package authz) is answered 403. A request with
// no verified certificate (plaintext, or TLS without client certificates)
// has no identity, so the table refuses it. With on false (no table, or a
// debug port that is not served over TLS and is guarded by its token or
// loopback), handlers are left as they are.
func (s *Server) httpAuthz(on bool) func(name string, h http.Handler) http.Handler {
	if !on || s.opts.Authz == nil {
		return func(_ string, h http.Handler) http.Handler { return h }
	}
	return func(name string, h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if err := s.allow(identities(r.TLS), name); err != nil {
				http.Error(w, status.Convert(err).Message(), http.StatusForbidden)
				return
			}
			h.ServeHTTP(w, r)
		})
	}
}
