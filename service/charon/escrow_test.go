package charon

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/internal/escrow"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/server"
)

// TestUsageEscrow: GET /usage reports what this replica's escrow leases
// hold of a pair in escrow, and explain says it.
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
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := charonv1.NewCharonClient(dial(t, s.GRPCAddr())).Explain(ctx, &charonv1.ExplainRequest{Domain: "api",
		Descriptors: []*charonv1.ExplainRequest_Descriptor{{Entries: []*charonv1.Entry{{Key: "tenant", Value: "acme"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if sum := resp.GetExplanations()[0].GetSummary(); !strings.Contains(sum, "in escrow on this replica") {
		t.Errorf("explain summary %q does not say the pair is in escrow", sum)
	}
}
