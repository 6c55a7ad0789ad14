package charon

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
)

// The candidate configuration (package canary) answers the explains that
// ask for it: Options.Candidate. (The RLS service has it decide every
// request in shadow: package service/rls.)

// errNoCandidate answers an explain of the candidate on a server without one.
var errNoCandidate = status.Error(codes.FailedPrecondition, "no candidate configuration (charon serve --candidate-config)")

// wantsCandidate reports whether an Explain call asks for the candidate.
func wantsCandidate(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	return len(md.Get(charonv1.CandidateHeader)) > 0
}

// candidateExplainer returns the candidate's Explainer, or an error when
// there is none.
func candidateExplainer(c Explainer) (Explainer, error) {
	if c == nil {
		return nil, errNoCandidate
	}
	return c, nil
}
