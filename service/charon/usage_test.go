package charon

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/timestamppb"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/server"
)

// TestUsageEndpoint: GET /usage on the HTTP port reports, per limit of the
// descriptor, its period, use, remaining and renewal: the rate limit's and
// the calendar quota's (renewing at the next midnight in Paris); the
// charon.v1 Usage call answers the same.
func TestUsageEndpoint(t *testing.T) {
	const text = `domain: api
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 5}
    quota: {limit: 100, period: day, time_zone: Europe/Paris}
`
	now := time.Date(2030, 6, 1, 21, 0, 0, 0, time.UTC)
	eng := engineFor(t, text, now)
	for range 3 {
		eng.ShouldRateLimit(context.Background(), &engine.Request{Domain: "api", Descriptors: []engine.Descriptor{{Entries: entriesOf("tenant", "acme")}}})
	}
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
	renewRate, renewQuota := now.Add(time.Minute), time.Date(2030, 6, 1, 22, 0, 0, 0, time.UTC)
	want := []UsageLimit{
		{Resource: "api/tenant", Domain: "acme", Kind: "rate", Period: "tiers, 1m0s", Limit: 5, Used: 3, Remaining: 2, Renews: &renewRate},
		{Resource: "api/tenant", Domain: "acme", Kind: "quota", Period: "day", Limit: 100, Used: 3, Remaining: 97, Renews: &renewQuota},
	}
	if diff := cmp.Diff(want, got.Limits); diff != "" {
		t.Errorf("usage (-want +got):\n%s\n%s", diff, body)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := charonv1.NewCharonClient(dial(t, s.GRPCAddr())).Usage(ctx, &charonv1.UsageRequest{Domain: "api",
		Descriptors: []*charonv1.ExplainRequest_Descriptor{{Entries: []*charonv1.Entry{{Key: "tenant", Value: "acme"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	wantRPC := &charonv1.UsageResponse{At: timestamppb.New(now), Limits: []*charonv1.UsageLimit{
		{Resource: "api/tenant", Domain: "acme", Kind: "rate", Period: "tiers, 1m0s", Limit: 5, Used: 3, Remaining: 2, Renews: timestamppb.New(renewRate)},
		{Resource: "api/tenant", Domain: "acme", Kind: "quota", Period: "day", Limit: 100, Used: 3, Remaining: 97, Renews: timestamppb.New(renewQuota)},
	}}
	if diff := cmp.Diff(wantRPC, resp, protocmp.Transform()); diff != "" {
		t.Errorf("Usage call (-want +got):\n%s", diff)
	}
	// A descriptor no limit matches reads nothing: no time either.
	if body, code := fetch(t, "GET", "http://"+s.HTTPAddr()+"/usage?domain=api&descriptor=other=x", "", ""); code != http.StatusOK ||
		strings.Contains(body, `"at"`) || !strings.Contains(body, `"limits": []`) {
		t.Errorf("GET /usage matching no limit: %d %s, want 200, no limits and no time", code, body)
	}
}

// TestUsageUnknownDomain: the usage of a domain the configuration does not
// have is NotFound (404 on /usage), naming it and the domains there are,
// at most ten of them and how many more; not a usage of nothing at the
// zero time.
func TestUsageUnknownDomain(t *testing.T) {
	files := fstest.MapFS{}
	for i := range 12 {
		files[fmt.Sprintf("d%02d.yaml", i)] = &fstest.MapFile{Data: []byte(fmt.Sprintf("domain: d%02d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n", i))}
	}
	cfg, _, err := config.Load(files, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	st := memstore.New(memstore.Options{})
	defer st.Close()
	eng := engine.New(engine.Options{Store: st})
	eng.SetTree(cfg.Tree)
	s, stop := newTestServer(t, New(eng, nil, Options{}), server.Options{Engine: eng})
	defer stop()
	const want = `domain "dO1" is not configured; configured: d00, d01, d02, d03, d04, d05, d06, d07, d08, d09 and 2 more`
	body, code := fetch(t, "GET", "http://"+s.HTTPAddr()+"/usage?domain=dO1&descriptor=k=v", "", "")
	if code != http.StatusNotFound || !strings.HasPrefix(body, want) {
		t.Errorf("GET /usage of an unknown domain: %d %q, want 404 %q", code, body, want)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = charonv1.NewCharonClient(dial(t, s.GRPCAddr())).Usage(ctx, &charonv1.UsageRequest{Domain: "dO1",
		Descriptors: []*charonv1.ExplainRequest_Descriptor{{Entries: []*charonv1.Entry{{Key: "k", Value: "v"}}}}})
	if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), want) {
		t.Errorf("Usage call of an unknown domain: %v, want NotFound %q", err, want)
	}
	// With no configuration at all, it says so.
	eng.SetTree(nil)
	if body, code := fetch(t, "GET", "http://"+s.HTTPAddr()+"/usage?domain=d00&descriptor=k=v", "", ""); code != http.StatusNotFound ||
		!strings.Contains(body, `domain "d00" is not configured: the configuration has no domains`) {
		t.Errorf("GET /usage with no configuration: %d %q", code, body)
	}
}

// engineFor is an engine on a memory store, with api.yaml of text as its
// configuration and its clock stopped at now.
func engineFor(t *testing.T, text string, now time.Time) *engine.Engine {
	t.Helper()
	cfg, _, err := config.Load(fstest.MapFS{"api.yaml": {Data: []byte(text)}}, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	st := memstore.New(memstore.Options{})
	t.Cleanup(func() { st.Close() })
	eng := engine.New(engine.Options{Store: st, Now: func() time.Time { return now }})
	eng.SetTree(cfg.Tree)
	return eng
}
