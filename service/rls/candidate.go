package rls

import (
	"context"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/charonlimit/charon/internal/engine"
)

// Candidate decides every ShouldRateLimit request again under a candidate
// configuration, in shadow (package canary's Canary): Observe must change
// neither the request nor the live answer. It serves GET /candidate on the
// debug port, and its metrics are registered with the server's. (The
// charon.v1 service explains under it: charon.Options.Candidate.)
type Candidate interface {
	Observe(ctx context.Context, req *engine.Request, live *engine.Response)
	http.Handler
	prometheus.Collector
}
