package server

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net/http"
	"strings"

	"google.golang.org/grpc"
)

// A Service is served by a Server: the RLS service (package service/rls),
// charon.v1 (service/charon), RLQS (service/rlqs). New calls Register
// before the server loads its configuration or listens; Register declares
// on s, with the methods below, what the service serves: its gRPC
// services (RegisterService), its endpoints on the HTTP and debug ports,
// what runs beside it while the server serves (Go, Watch) and what ends
// when the shutdown begins (OnShutdown). A service never imports another:
// what two share is handed to both by the caller.
type Service interface {
	Register(s *Server) error
}

// Endpoint is a service's page on the HTTP or the debug port.
type Endpoint struct {
	// Pattern is its http.ServeMux pattern ("GET /top").
	Pattern string
	// Name is its name in the authorization table (package authz's
	// constants, authz.DebugTop): with a table, a client the table does
	// not allow it is answered 403.
	Name    string
	Handler http.Handler
	// Index is its line on the debug port's index page ("" for none).
	Index string
	// Traced starts a server span for each request when Options.Tracing is
	// on, as the gRPC calls get.
	Traced bool
	// Public, on the debug port, reports the requests served without the
	// debug token: files that hold no data (the live page's), which a
	// browser loads, and its login form, before it can send one. A token
	// refusal then says to open the endpoint in a browser.
	Public func(*http.Request) bool
}

// path is the URL path of e's pattern ("GET /top" is /top).
func (e Endpoint) path() string {
	p := e.Pattern
	if i := strings.IndexByte(p, ' '); i >= 0 {
		p = p[i+1:]
	}
	return p
}

// RegisterService registers a gRPC service and its implementation (the
// generated RegisterXServer functions take s): Service.Register calls it.
// It implements grpc.ServiceRegistrar.
func (s *Server) RegisterService(desc *grpc.ServiceDesc, impl any) {
	s.grpcServices = append(s.grpcServices, registered{desc, impl})
}

// registered is a gRPC service awaiting the gRPC server.
type registered struct {
	desc *grpc.ServiceDesc
	impl any
}

// GRPCOption adds an option of the gRPC server (the RLS service's codec,
// which keeps the bytes Envoy forwards): Service.Register calls it.
func (s *Server) GRPCOption(o grpc.ServerOption) { s.grpcOptions = append(s.grpcOptions, o) }

// HandleHTTP serves e on the HTTP port; HandleDebug on the debug port.
// Service.Register calls them.
func (s *Server) HandleHTTP(e Endpoint)  { s.httpEndpoints = append(s.httpEndpoints, e) }
func (s *Server) HandleDebug(e Endpoint) { s.debugEndpoints = append(s.debugEndpoints, e) }

// Go runs f while the server serves: Serve starts it and, once the server
// has stopped serving (its listeners closed, the requests in flight
// answered), cancels ctx and waits for f to return, so that f may finish
// what the last requests handed it. Service.Register calls it.
func (s *Server) Go(f func(ctx context.Context)) { s.tasks = append(s.tasks, f) }

// Watch polls r every PollInterval while the server serves, as it polls
// ConfigDir, and stops before the shutdown begins (the candidate
// configuration's directory). Service.Register calls it.
func (s *Server) Watch(r *Reloader) { s.watched = append(s.watched, r) }

// OnShutdown calls f when the shutdown begins, before the requests in
// flight are waited for: a service ends its streams there (a Session's
// holds are released, Envoys reconnect elsewhere) rather than hold up the
// graceful stop. Service.Register calls it.
func (s *Server) OnShutdown(f func()) { s.onShutdown = append(s.onShutdown, f) }

// Logger is the server's log.
func (s *Server) Logger() *slog.Logger { return s.log }

// Ready returns nil once the server has a configuration to serve with and,
// before, while Options.WaitForConfig waits for the first, the error to
// answer requests with (UNAVAILABLE, saying where it is awaited from).
func (s *Server) Ready() error {
	if s.configReady.Load() {
		return nil
	}
	return s.noConfig
}

// DebugAuthenticated reports whether every debug port request must
// authenticate: a DebugToken, or a DebugTLS that verifies client
// certificates. An endpoint that changes state (POST /reset) is served
// only then. A DebugTLS from package tlsconfig says at its top level
// whether it verifies clients, though its handshakes use the config its
// GetConfigForClient builds.
func (s *Server) DebugAuthenticated() bool {
	return s.opts.DebugToken != "" || (s.opts.DebugTLS != nil && s.opts.DebugTLS.ClientAuth == tls.RequireAndVerifyClientCert)
}
