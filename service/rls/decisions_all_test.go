package rls

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/charonlimit/charon/internal/decisionlog"
	"github.com/charonlimit/charon/server"
)

// TestCompleteDecisionLog: a complete log (--decision-log-all) has a line
// for every descriptor, limited or not, the lines of one request sharing
// its name, with the request's answer, its hits and the decision's time.
func TestCompleteDecisionLog(t *testing.T) {
	eng, _ := testEngine(t)
	var buf bytes.Buffer
	dl := decisionlog.New(&buf, decisionlog.Options{All: true, Rate: -1})
	s, stop := newTestServer(t, Options{DecisionLog: dl}, server.Options{Engine: eng})
	c := rlsv3.NewRateLimitServiceClient(dial(t, s.GRPCAddr()))
	for range 4 {
		if _, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "c", HitsAddend: 2,
			Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("rate", "x"), desc("nothing", "y")}}); err != nil {
			t.Fatal(err)
		}
	}
	stop()
	dl.Close()
	var recs []decisionlog.Record
	sc := bufio.NewScanner(&buf)
	for sc.Scan() {
		var r decisionlog.Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		recs = append(recs, r)
	}
	if len(recs) != 8 {
		t.Fatalf("%d lines, want 8 (two descriptors of four requests)", len(recs))
	}
	names := map[string]bool{}
	for i := 0; i < len(recs); i += 2 {
		a, b := recs[i], recs[i+1]
		if a.Request == "" || a.Request != b.Request || names[a.Request] {
			t.Errorf("request names %q and %q: want one new name per request", a.Request, b.Request)
		}
		names[a.Request] = true
		if !a.Complete || !b.Complete || a.Weight != 1 || a.Hits != 2 || a.Resource == "" || a.Time.IsZero() || !a.Time.Equal(b.Time) {
			t.Errorf("line %+v: want a complete line of 2 hits with its rule and time", a)
		}
		if b.Result != decisionlog.ResultNotLimited || b.Granted != 2 || b.Resource != "" {
			t.Errorf("line %+v: want the unmatched descriptor, not limited", b)
		}
		if a.OverLimit != (a.Result == decisionlog.ResultRejected) {
			t.Errorf("line %+v: the request's answer does not follow its one limited descriptor", a)
		}
	}
}
