package server

import (
	"context"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
	"github.com/charonlimit/charon/internal/engine"
)

// Candidate decides every ShouldRateLimit request again under a candidate
// configuration, in shadow (package canary's Canary): Observe must change
// neither the request nor the live answer. Its explanations answer an
// explain asked of the candidate, it serves GET /candidate on the debug
// port, and its metrics are registered with the server's.
type Candidate interface {
	Observe(ctx context.Context, req *engine.Request, live *engine.Response)
	Explainer
	http.Handler
	prometheus.Collector
}

// errNoCandidate answers an explain of the candidate on a server without one.
var errNoCandidate = status.Error(codes.FailedPrecondition, "no candidate configuration (charon serve --candidate-config)")

// wantsCandidate reports whether an Explain call asks for the candidate.
func wantsCandidate(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	return len(md.Get(charonv1.CandidateHeader)) > 0
}

// candidateExplainer returns the candidate's Explainer, or an error when
// there is none.
func candidateExplainer(c Candidate) (Explainer, error) {
	if c == nil {
		return nil, errNoCandidate
	}
	return c, nil
}
