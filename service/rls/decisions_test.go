package rls

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/decisionlog"
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/internal/escrow"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/server"
	"github.com/charonlimit/charon/tiers"
)

// decisionLogServer serves testTree with a decision log that keeps the
// given sample. finish stops the server, closes the log and returns its
// lines: Close waits for the log's writer, so a plain buffer serves.
func decisionLogServer(t *testing.T, sample float64) (s *testServer, c rlsv3.RateLimitServiceClient, finish func() []decisionlog.Record) {
	t.Helper()
	eng, _ := testEngine(t)
	var buf bytes.Buffer
	dl := decisionlog.New(&buf, decisionlog.Options{Sample: sample})
	s, stop := newTestServer(t, Options{DecisionLog: dl}, server.Options{Engine: eng})
	finish = func() []decisionlog.Record {
		t.Helper()
		stop()
		dl.Close()
		var out []decisionlog.Record
		sc := bufio.NewScanner(&buf)
		for sc.Scan() {
			var r decisionlog.Record
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				t.Fatalf("line %q: %v", sc.Text(), err)
			}
			out = append(out, r)
		}
		return out
	}
	return s, rlsv3.NewRateLimitServiceClient(dial(t, s.GRPCAddr())), finish
}

// TestDecisionLogKeepsRejectionsAndBursts: with a sample of 0, exactly the
// burst into tier 1 and the rejections are logged, with their context;
// unconfigured grants are counted per domain and top-level key, bounded.
func TestDecisionLogKeepsRejectionsAndBursts(t *testing.T) {
	s, c, finish := decisionLogServer(t, 0)
	ctx := context.Background()
	ask := func(domain string, kv ...string) {
		t.Helper()
		if _, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc(kv...)}}); err != nil {
			t.Fatal(err)
		}
	}
	for range 5 {
		ask("c", "rate", "x")
	}
	for i := range 300 {
		ask("open", fmt.Sprintf("k%d", i), "v")
	}
	ask("open", "k0", "v")
	recs := finish()
	if len(recs) != 3 {
		t.Fatalf("%d lines, want 3 (the burst and 2 rejections): %+v", len(recs), recs)
	}
	if r := recs[0]; r.Result != decisionlog.ResultGranted || !r.Burst || r.Granted != 1 || r.Tier != 1 || r.Weight != 1 ||
		r.RLSDomain != "c" || r.Domain != "x" || len(r.Entries) != 1 || r.Entries[0] != (decisionlog.Entry{Key: "rate", Value: "x"}) {
		t.Errorf("first line %+v, want the burst into tier 1", r)
	}
	for _, r := range recs[1:] {
		if r.Result != decisionlog.ResultRejected || r.LimitedBy != "tier" || r.Granted != 0 || r.Hits != 1 {
			t.Errorf("line %+v, want a rejection by the tier", r)
		}
	}
	u := s.svc.metrics.unconfigured.vec
	if got := testutil.ToFloat64(u.WithLabelValues("open", "k0")); got != 2 {
		t.Errorf("unconfigured hits of open/k0 = %v, want 2", got)
	}
	if n := testutil.CollectAndCount(u); n != maxUnconfiguredKeys+1 {
		t.Errorf("%d unconfigured series, want %d and ~other", n, maxUnconfiguredKeys+1)
	}
	if got := testutil.ToFloat64(u.WithLabelValues("open", "~other")); got != 300-maxUnconfiguredKeys {
		t.Errorf("~other = %v, want %d", got, 300-maxUnconfiguredKeys)
	}
}

// TestDecisionLogSamplesUnconfigured: with a sample of 1 every decision is
// a line, unconfigured ones included.
func TestDecisionLogSamplesUnconfigured(t *testing.T) {
	_, c, finish := decisionLogServer(t, 1)
	if _, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "open",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("path", "/a"), desc("path", "/b")}}); err != nil {
		t.Fatal(err)
	}
	recs := finish()
	if len(recs) != 2 || recs[0].Result != decisionlog.ResultUnconfigured || recs[0].Granted != 1 || recs[1].Entries[0].Value != "/b" {
		t.Errorf("lines %+v, want two unconfigured grants", recs)
	}
}

// TestCompleteLogKeepsRequestsWhole: under a rate bound a complete log keeps
// a request with all its descriptors or drops it whole, so that replay sees a
// dropped request as a gap in the numbering.
func TestCompleteLogKeepsRequestsWhole(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(1_700_000_000, 0)
	dl := decisionlog.New(&buf, decisionlog.Options{All: true, Rate: 1, Now: func() time.Time { return now }})
	req := &engine.Request{Domain: "d", Descriptors: []engine.Descriptor{
		{Entries: []descriptors.Entry{{Key: "a", Value: "1"}}}, {Entries: []descriptors.Entry{{Key: "b", Value: "2"}}},
		{Entries: []descriptors.Entry{{Key: "c", Value: "3"}}}}}
	resp := &engine.Response{Code: engine.CodeOK, Statuses: make([]engine.Status, 3)}
	for i := range resp.Statuses {
		resp.Statuses[i] = engine.Status{Code: engine.CodeOK, Limit: &engine.CurrentLimit{RequestsPerUnit: 5, Unit: tiers.UnitSecond}}
	}
	logDecisions(dl, now, req, resp) // kept whole
	logDecisions(dl, now, req, resp) // over the bound of one a second: dropped whole
	dl.Close()
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines, want the 3 of the first request:\n%s", len(lines), buf.String())
	}
	for _, l := range lines {
		if !strings.Contains(l, `-1"`) {
			t.Errorf("a line of another request than the first: %s", l)
		}
	}
}

// TestDecisionLogSaysEscrowLocal: a decision made from this replica's
// escrow lease reaches the decision log, through the engine and the RLS
// service, as "escrow": "local"; one made by the shared store says nothing.
func TestDecisionLogSaysEscrowLocal(t *testing.T) {
	clock := &testClock{}
	clock.ns.Store(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC).UnixNano())
	mem := memstore.New(memstore.Options{})
	t.Cleanup(func() { mem.Close() })
	esc, err := escrow.New(escrow.Options{Remote: mem, Now: clock.Now, Default: true, Threshold: 5, Size: escrow.SizeDemand})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { esc.Close() })
	tree, err := descriptors.NewTree([]descriptors.DomainSpec{{Config: descriptors.DomainConfig{Name: "c"}, Nodes: []*descriptors.Node{
		{Key: "tenant", Limit: &descriptors.Limit{Policy: &tiers.Policy{Kind: tiers.KindTiers,
			Tiers: []tiers.Tier{{Limit: 1000, Window: time.Minute, Active: tiers.Unbounded}}}}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	eng := engine.New(engine.Options{Store: esc, OnSetTree: esc.SetTree, Now: clock.Now})
	eng.SetTree(tree)
	var buf bytes.Buffer
	dl := decisionlog.New(&buf, decisionlog.Options{Sample: 1, Rate: -1})
	s, stop := newTestServer(t, Options{DecisionLog: dl}, server.Options{Engine: eng})
	c := rlsv3.NewRateLimitServiceClient(dial(t, s.GRPCAddr()))
	ask := func() {
		t.Helper()
		resp, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "c",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("tenant", "acme")}})
		if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("%v, %v", resp, err)
		}
	}
	const remote = 10 // decided by the shared store while the pair heats up
	for range remote {
		ask()
	}
	esc.Tick(context.Background()) // the lease
	if st := esc.Stats(); st.Leases != 1 {
		t.Fatalf("escrow stats %+v: want one lease", st)
	}
	ask() // from the lease
	stop()
	dl.Close()
	text := buf.String()
	var got []string
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		var r decisionlog.Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		got = append(got, r.Escrow)
	}
	want := append(make([]string, remote), decisionlog.EscrowLocal)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("escrow of each line (-want +got):\n%s", diff)
	}
	if n := strings.Count(text, `"escrow":"local"`); n != 1 {
		t.Errorf("%d lines say \"escrow\":\"local\", want 1:\n%s", n, text)
	}
}
