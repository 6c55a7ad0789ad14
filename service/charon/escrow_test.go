package charon

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"testing"
	"testing/fstest"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/timestamppb"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/internal/escrow"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/server"
)

// TestUsageEscrow: GET /usage, and the Usage and Explain calls, report
// what this replica's escrow leases hold of a pair in escrow.
func TestUsageEscrow(t *testing.T) {
	const text = `domain: api
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 1000}
    escrow: true
`
	now := time.Date(2030, 6, 1, 21, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	cfg, _, err := config.Load(fstest.MapFS{"api.yaml": {Data: []byte(text)}}, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	mem := memstore.New(memstore.Options{})
	t.Cleanup(func() { mem.Close() })
	esc, err := escrow.New(escrow.Options{Remote: mem, Now: clock, Threshold: 5, Size: escrow.SizeDemand})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { esc.Close() })
	eng := engine.New(engine.Options{Store: esc, OnSetTree: esc.SetTree, Now: clock})
	eng.SetTree(cfg.Tree)
	req := &engine.Request{Domain: "api", Descriptors: []engine.Descriptor{{Entries: entriesOf("tenant", "acme")}}}
	for range 10 {
		eng.ShouldRateLimit(context.Background(), req)
	}
	esc.Tick(context.Background())
	eng.ShouldRateLimit(context.Background(), req) // from the lease
	s, stop := newTestServer(t, New(eng, nil, Options{}), server.Options{Engine: eng})
	defer stop()
	body, code := fetch(t, "GET", "http://"+s.HTTPAddr()+"/usage?domain=api&descriptor="+url.QueryEscape("tenant=acme"), "", "")
	if code != http.StatusOK {
		t.Fatalf("GET /usage: %d %s", code, body)
	}
	var got Usage
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Limits) != 1 || got.Limits[0].Escrow == nil {
		t.Fatalf("usage without escrow: %s", body)
	}
	e := got.Limits[0].Escrow
	if e.Leases != 1 || e.Granted != 1 || e.Held < 1 || !e.Until.Equal(now.Add(escrow.DefaultLease)) {
		t.Errorf("escrow %+v: want one lease until %v, one hit granted from it", e, now.Add(escrow.DefaultLease))
	}
	// The Usage and Explain calls carry the same, as an EscrowHolding.
	want := &charonv1.EscrowHolding{Leases: 1, Held: e.Held, Granted: 1, Until: timestamppb.New(now.Add(escrow.DefaultLease)),
		Rate: e.Rate, Demand: e.Demand, Share: -1}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	client := charonv1.NewCharonClient(dial(t, s.GRPCAddr()))
	descs := []*charonv1.ExplainRequest_Descriptor{{Entries: []*charonv1.Entry{{Key: "tenant", Value: "acme"}}}}
	u, err := client.Usage(ctx, &charonv1.UsageRequest{Domain: "api", Descriptors: descs})
	if err != nil {
		t.Fatal(err)
	}
	if len(u.GetLimits()) != 1 {
		t.Fatalf("Usage: %v, want one limit", u)
	}
	if diff := cmp.Diff(want, u.GetLimits()[0].GetEscrow(), protocmp.Transform()); diff != "" {
		t.Errorf("Usage's escrow (-want +got):\n%s", diff)
	}
	resp, err := client.Explain(ctx, &charonv1.ExplainRequest{Domain: "api", Descriptors: descs})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, resp.GetExplanations()[0].GetEscrow(), protocmp.Transform()); diff != "" {
		t.Errorf("Explain's escrow (-want +got):\n%s", diff)
	}
	// A pair not in escrow has none.
	other := []*charonv1.ExplainRequest_Descriptor{{Entries: []*charonv1.Entry{{Key: "tenant", Value: "other"}}}}
	if u, err := client.Usage(ctx, &charonv1.UsageRequest{Domain: "api", Descriptors: other}); err != nil || u.GetLimits()[0].GetEscrow() != nil {
		t.Errorf("Usage of a pair not in escrow: %v, %v; want no escrow", u, err)
	}
}
