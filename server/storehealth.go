package server

import (
	"context"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// SetServing sets the gRPC health of the server (the overall service "" and
// RLSServiceName) to SERVING or NOT_SERVING; /healthcheck follows it (500
// while NOT_SERVING). A store that cannot answer (the Redis store in the
// unavailable failure mode while Redis is down) drives it. While
// Options.WaitForConfig waits for a first configuration, health stays
// NOT_SERVING whatever ok says, and follows it afterwards. It has no effect
// once the server is shutting down, which turns health NOT_SERVING for good.
func (s *Server) SetServing(ok bool) {
	s.storeOK.Store(ok)
	s.updateHealth()
}

// updateHealth sets health from the store's and the configuration's state.
func (s *Server) updateHealth() {
	s.healthMu.Lock()
	defer s.healthMu.Unlock()
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if s.storeOK.Load() && s.configReady.Load() {
		st = healthpb.HealthCheckResponse_SERVING
	}
	for _, name := range healthNames {
		s.health.SetServingStatus(name, st)
	}
}

// serving reports whether the gRPC health of RLSServiceName is SERVING.
func (s *Server) serving() bool {
	r, err := s.health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: RLSServiceName})
	return err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING
}
