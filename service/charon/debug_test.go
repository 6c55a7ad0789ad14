package charon

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/internal/canary"
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/internal/tlsconfig"
	"github.com/charonlimit/charon/internal/tlsconfig/tlstest"
	"github.com/charonlimit/charon/server"
)

// TestExplainCandidate: Explain and GET /explain answer under the
// candidate configuration when asked (charonv1.CandidateHeader,
// ?candidate=1), with the candidate's own state, and refuse with
// FailedPrecondition on a server without one.
func TestExplainCandidate(t *testing.T) {
	eng, clock := charonEngine(t)
	cfg, _, err := config.Load(fstest.MapFS{"c.yaml": {Data: []byte("domain: c\ndescriptors:\n  - key: rate\n    rate_limit: {unit: second, requests_per_unit: 1}\n")}}, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cand := canary.New(canary.Options{Engine: engine.Options{Now: clock.Now}})
	defer cand.Close()
	cand.SetConfig(cfg)
	// One request the candidate decided (the RLS service hands it each
	// live decision).
	req := &engine.Request{Domain: "c", Descriptors: []engine.Descriptor{{Entries: entriesOf("rate", "x")}}}
	live, err := eng.ShouldRateLimit(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	cand.Observe(context.Background(), req, live)

	s, stop := newTestServer(t, New(eng, nil, Options{Candidate: cand}), server.Options{Engine: eng})
	defer stop()
	if body, _ := fetch(t, "GET", "http://"+s.DebugAddr()+"/explain?candidate=1&domain=c&descriptor=rate=x", "", ""); !strings.Contains(strings.ReplaceAll(body, " ", ""), `"limit":"1"`) || !strings.Contains(strings.ReplaceAll(body, " ", ""), `"hits":"1"`) {
		t.Errorf("/explain?candidate=1 does not show the candidate's state (1 hit granted): %s", body)
	}
	cc := charonv1.NewCharonClient(dial(t, s.GRPCAddr()))
	ereq := explainReq("c", "rate=x")
	if got, err := cc.Explain(context.Background(), ereq); err != nil || got.GetExplanations()[0].GetTiers()[0].GetLimit() != 3 {
		t.Errorf("live explain: %v %v", got, err)
	}
	ctx := metadata.AppendToOutgoingContext(context.Background(), charonv1.CandidateHeader, "1")
	if got, err := cc.Explain(ctx, ereq); err != nil || got.GetExplanations()[0].GetTiers()[0].GetLimit() != 1 {
		t.Errorf("candidate explain: %v %v", got, err)
	}

	s2, stop2 := newTestServer(t, New(eng, nil, Options{}), server.Options{Engine: eng})
	defer stop2()
	if _, err := charonv1.NewCharonClient(dial(t, s2.GRPCAddr())).Explain(ctx, ereq); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("candidate explain without a candidate: %v, want FailedPrecondition", err)
	}
	if _, code := fetch(t, "GET", "http://"+s2.DebugAddr()+"/explain?candidate=1&domain=c&descriptor=rate=x", "", ""); code != http.StatusInternalServerError {
		t.Errorf("/explain?candidate=1 without a candidate: %d, want the FailedPrecondition's 500", code)
	}
}

// TestDebugResetTLS: POST /reset is served on a debug port whose TLS, built
// by tlsconfig as serve builds it, verifies client certificates, and
// refused at start on one that does not.
func TestDebugResetTLS(t *testing.T) {
	m := tlstest.NewMutual(t, "charon.test", "ops.test")
	mutual, err := tlsconfig.NewServer(tlsconfig.Options{CertFile: m.CertFile, KeyFile: m.KeyFile, ClientCAFile: m.CA.File})
	if err != nil {
		t.Fatal(err)
	}
	eng, _ := charonEngine(t)
	s, stop := newTestServer(t, New(eng, nil, Options{DebugReset: true}), server.Options{Engine: eng, DebugTLS: mutual.Config()})
	defer stop()
	ccfg, err := tlsconfig.Client(tlsconfig.ClientOptions{CAFile: m.CA.File, ServerName: m.ServerName, CertFile: m.ClientCertFile, KeyFile: m.ClientKeyFile})
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: ccfg}, Timeout: 10 * time.Second}
	resp, err := hc.Post("https://"+s.DebugAddr()+"/reset?domain=c&descriptor="+url.QueryEscape("rate=x"), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("POST /reset over mutual TLS: %d, want 200", resp.StatusCode)
	}

	noCA, err := tlsconfig.NewServer(tlsconfig.Options{CertFile: m.CertFile, KeyFile: m.KeyFile})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := server.New(server.Options{Engine: eng, GRPCAddr: "127.0.0.1:0", DebugTLS: noCA.Config()}, New(eng, nil, Options{DebugReset: true})); err == nil || !strings.Contains(err.Error(), "DebugReset") {
		t.Errorf("DebugReset over TLS without a client CA: got %v, want a refusal", err)
	}
}
