package rls

import (
	"context"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/internal/canary"
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/server"
)

// TestCandidate: a candidate configuration that would reject more never
// changes an answer; its counts show on /metrics and /candidate. (The
// charon.v1 service explains under it: service/charon's
// TestExplainCandidate.)
func TestCandidate(t *testing.T) {
	eng, clock := testEngine(t)
	cfg, _, err := config.Load(fstest.MapFS{"c.yaml": {Data: []byte("domain: c\ndescriptors:\n  - key: rate\n    rate_limit: {unit: second, requests_per_unit: 1}\n")}}, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cand := canary.New(canary.Options{Engine: engine.Options{Now: clock.Now}})
	defer cand.Close()
	cand.SetConfig(cfg)
	s, stop := newTestServer(t, Options{Candidate: cand}, server.Options{Engine: eng})
	defer stop()
	conn := dial(t, s.GRPCAddr())
	c := rlsv3.NewRateLimitServiceClient(conn)
	var codes_ []rlsv3.RateLimitResponse_Code
	for range 4 {
		resp, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "c", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("rate", "x")}})
		if err != nil {
			t.Fatal(err)
		}
		codes_ = append(codes_, resp.GetOverallCode())
	}
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	if want := []rlsv3.RateLimitResponse_Code{ok, ok, ok, over}; !equalCodes(codes_, want) {
		t.Errorf("answers %v, want the live limit's 3 per second %v", codes_, want)
	}
	// The candidate decides in the background: wait for it.
	rep := cand.Report()
	for deadline := time.Now().Add(20 * time.Second); rep.Requests.Agree+rep.Requests.WouldReject+rep.Requests.WouldGrant < 4; rep = cand.Report() {
		if time.Now().After(deadline) {
			t.Fatalf("the candidate decided %+v of 4 requests in 20 s", rep.Requests)
		}
		time.Sleep(time.Millisecond)
	}
	if rep.Requests.Agree != 2 || rep.Requests.WouldReject != 2 {
		t.Errorf("requests %+v, want 2 agreeing (the first and the last) and 2 the candidate would reject", rep.Requests)
	}
	if body, _ := get(t, "http://"+s.DebugAddr()+"/metrics"); !strings.Contains(body, `charon_candidate_decisions_total{domain="c",outcome="would_reject",rule="rate"} 2`) {
		t.Errorf("/metrics lacks the candidate's counts:\n%s", grepLines(body, "candidate"))
	}
	if body, _ := get(t, "http://"+s.DebugAddr()+"/candidate"); !strings.Contains(body, `"would_reject": 2`) {
		t.Errorf("/candidate: %s", body)
	}
}

func equalCodes(a, b []rlsv3.RateLimitResponse_Code) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// blockingCandidate is a candidate whose every decision waits until
// release is closed: the slowest candidate there can be.
type blockingCandidate struct {
	Candidate
	release chan struct{}
	seen    chan struct{}
}

func (b *blockingCandidate) Observe(context.Context, *engine.Request, *engine.Response) {
	b.seen <- struct{}{}
	<-b.release
}

// TestCandidateNeverDelays: answers never wait for the candidate, by
// construction: with a candidate that blocks every decision, requests are
// answered while it blocks; once its queue is full the rest are dropped
// and counted, and the server stops cleanly once it is released.
func TestCandidateNeverDelays(t *testing.T) {
	eng, _ := testEngine(t)
	cand := canary.New(canary.Options{})
	defer cand.Close()
	b := &blockingCandidate{Candidate: cand, release: make(chan struct{}), seen: make(chan struct{}, candidateQueue+16)}
	s, stop := newTestServer(t, Options{Candidate: b}, server.Options{Engine: eng})
	c := rlsv3.NewRateLimitServiceClient(dial(t, s.GRPCAddr()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 3 {
		if _, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "c", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("rate", "x")}}); err != nil {
			t.Fatalf("request %d while the candidate blocks: %v", i, err)
		}
	}
	<-b.seen // the first is being decided, and blocks
	// Fill the queue: what does not fit is dropped, never waited for.
	for range candidateQueue + 2 {
		s.svc.candidate.Observe(ctx, &engine.Request{Domain: "c"}, &engine.Response{})
	}
	if s.svc.candidate.Dropped() == 0 {
		t.Error("nothing dropped with the queue full")
	}
	if body, _ := get(t, "http://"+s.DebugAddr()+"/metrics"); !strings.Contains(body, "charon_candidate_dropped_total") {
		t.Error("/metrics lacks charon_candidate_dropped_total")
	}
	close(b.release)
	stop()
	if p := s.svc.candidate.Pending(); p != 0 {
		t.Errorf("%d observations pending after the server stopped", p)
	}
}
