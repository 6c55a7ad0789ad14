package server

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/authz"
)

// The server's tests serve fakes of the services (the real ones are tested
// in their packages, and together in cmd/charon's process tests): what the
// lifecycle does to a service's calls and endpoints (authorization, TLS,
// tracing, drain, Ready) is the same whatever the service answers.

// fakeEngine counts the trees it is given.
type fakeEngine struct {
	mu    sync.Mutex
	trees int
}

func (f *fakeEngine) SetTree(*descriptors.Tree) {
	f.mu.Lock()
	f.trees++
	f.mu.Unlock()
}

// fakeRLS answers ShouldRateLimit OK, OVER_LIMIT when a descriptor's first
// value is "over", or Ready's error while the server waits for a
// configuration; /json (traced) answers 200, or 429 for "over".
type fakeRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
	srv *Server
}

func (f *fakeRLS) Register(s *Server) error {
	f.srv = s
	rlsv3.RegisterRateLimitServiceServer(s, f)
	s.HandleHTTP(Endpoint{Pattern: "/json", Name: authz.ShouldRateLimit, Handler: http.HandlerFunc(f.serveJSON), Traced: true})
	return nil
}

func (f *fakeRLS) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if err := f.srv.Ready(); err != nil {
		return nil, GRPCError(err)
	}
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
	for _, d := range req.GetDescriptors() {
		if es := d.GetEntries(); len(es) > 0 && es[0].GetValue() == "over" {
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
	}
	return resp, nil
}

func (f *fakeRLS) serveJSON(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if strings.Contains(string(body), `"over"`) {
		w.WriteHeader(http.StatusTooManyRequests)
	}
	io.WriteString(w, "{}")
}

// fakeCharon grants every Reserve and Usage, holds a Session open until
// its client ends it, and serves GET /usage, GET /explain and POST /reset
// with an empty answer.
type fakeCharon struct {
	charonv1.UnimplementedCharonServer
}

func (f *fakeCharon) Register(s *Server) error {
	charonv1.RegisterCharonServer(s, f)
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "{}") })
	s.HandleHTTP(Endpoint{Pattern: "GET /usage", Name: authz.Usage, Handler: ok})
	s.HandleDebug(Endpoint{Pattern: "GET /explain", Name: authz.DebugExplain, Handler: ok, Index: "/explain: fake\n"})
	s.HandleDebug(Endpoint{Pattern: "POST /reset", Name: authz.DebugReset, Handler: ok})
	return nil
}

func (f *fakeCharon) Reserve(context.Context, *charonv1.ReserveRequest) (*charonv1.ReserveResponse, error) {
	return &charonv1.ReserveResponse{Ok: true}, nil
}

func (f *fakeCharon) Usage(context.Context, *charonv1.UsageRequest) (*charonv1.UsageResponse, error) {
	return &charonv1.UsageResponse{}, nil
}

func (f *fakeCharon) Session(st grpc.BidiStreamingServer[charonv1.SessionRequest, charonv1.SessionResponse]) error {
	<-st.Context().Done()
	return nil
}
