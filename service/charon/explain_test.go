package charon

import (
	"context"
	"crypto/tls"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/server"
)

func explainReq(domain string, descs ...string) *charonv1.ExplainRequest {
	r := &charonv1.ExplainRequest{Domain: domain}
	for _, d := range descs {
		es, err := descriptors.ParseDescriptor(d)
		if err != nil {
			panic(err)
		}
		r.Descriptors = append(r.Descriptors, &charonv1.ExplainRequest_Descriptor{Entries: protoEntries(es)})
	}
	return r
}

func TestExplainRPC(t *testing.T) {
	f := newCharonFixture(t, Options{}, nil)
	ctx := context.Background()
	if _, err := f.c.Request(ctx, &charonv1.RequestRequest{Resource: res("c", "rate", "x"), Copies: 2, MinCopies: 2}); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(250 * time.Millisecond)
	resp, err := f.c.Explain(ctx, explainReq("c", "rate=x", "db=a", "nothing=1"))
	if err != nil {
		t.Fatalf("Explain: %v", err)
	}
	x := resp.Explanations[0]
	if !x.Limited || x.Kind != "tiers" || x.Tier != 1 || len(x.Tiers) != 1 || x.Tiers[0].Hits != 2 || x.Tiers[0].Phase != "active" ||
		x.Remaining != 1 || x.ResetAfter.AsDuration() != 750*time.Millisecond || x.DomainHits != 2 || x.Summary == "" {
		t.Errorf("explanation of rate=x: %v", x)
	}
	if x.Tiers[0].Active != nil || x.Tiers[0].Limit != 3 {
		t.Errorf("tier 1 should be 3 per 1s active for ever: %v", x.Tiers[0])
	}
	if !resp.At.AsTime().Equal(f.clock.Now()) {
		t.Errorf("at = %v, want the engine's clock %v", resp.At.AsTime(), f.clock.Now())
	}
	if db := resp.Explanations[1]; db.Limited || db.Reason != engine.ReasonCopies {
		t.Errorf("copy-limited resource: %v", db)
	}
	if no := resp.Explanations[2]; no.Limited || no.Reason != engine.ReasonNoMatch {
		t.Errorf("unmatched: %v", no)
	}
	// Explaining changed nothing: one more hit is granted, then none.
	for i, want := range []bool{true, false} {
		r, err := f.c.Request(ctx, &charonv1.RequestRequest{Resource: res("c", "rate", "x"), Copies: 1, MinCopies: 1})
		if err != nil || r.Ok != want {
			t.Fatalf("request %d after explain: ok %v, %v; want %v", i, r.GetOk(), err, want)
		}
	}
	_, err = f.c.Explain(ctx, explainReq("", "rate=x"))
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("explain without domain: %v, want InvalidArgument", err)
	}
}

func TestDebugExplainAndReset(t *testing.T) {
	eng, _ := charonEngine(t)
	if _, err := server.New(server.Options{Engine: eng, GRPCAddr: "127.0.0.1:0"}, New(eng, nil, Options{DebugReset: true})); err == nil || !strings.Contains(err.Error(), "DebugReset") {
		t.Fatalf("DebugReset without authentication: %v, want a refusal", err)
	}
	if _, err := server.New(server.Options{Engine: eng, GRPCAddr: "127.0.0.1:0", DebugTLS: &tls.Config{}}, New(eng, nil, Options{DebugReset: true})); err == nil {
		t.Fatal("DebugReset with TLS that does not verify clients: accepted")
	}
	s, stop := newTestServer(t, New(eng, nil, Options{DebugReset: true}), server.Options{Engine: eng, DebugToken: "tok"})
	defer stop()
	base := "http://" + s.DebugAddr()
	for range 3 {
		eng.ShouldRateLimit(context.Background(), &engine.Request{Domain: "c", Descriptors: []engine.Descriptor{{Entries: entriesOf("rate", "x")}}})
	}
	q := "?domain=c&descriptor=" + url.QueryEscape("rate=x")
	if _, code := fetch(t, "GET", base+"/explain"+q, "", ""); code != http.StatusUnauthorized {
		t.Errorf("explain without the token: %d, want 401", code)
	}
	body, code := fetch(t, "GET", base+"/explain"+q, "tok", "")
	var resp charonv1.ExplainResponse
	if code != 200 || protojson.Unmarshal([]byte(body), &resp) != nil || resp.Explanations[0].Remaining != 0 || resp.Explanations[0].RetryAfter.AsDuration() != time.Second {
		t.Fatalf("GET /explain: %d %s", code, body)
	}
	if body, code := fetch(t, "GET", base+"/explain?domain=c", "tok", ""); code != 400 || !strings.Contains(body, "descriptor") {
		t.Errorf("explain without a descriptor: %d %q", code, body)
	}
	if body, code := fetch(t, "GET", base+"/explain?domain=c&descriptor=%3Dv", "tok", ""); code != 400 || !strings.Contains(body, "no key") {
		t.Errorf("explain of an entry without key: %d %q", code, body)
	}
	if _, code := fetch(t, "GET", base+"/reset"+q, "tok", ""); code != http.StatusMethodNotAllowed {
		t.Errorf("GET /reset: %d, want 405", code)
	}
	if body, code := fetch(t, "POST", base+"/reset"+q, "tok", ""); code != 200 || !strings.Contains(body, `"reset": 1`) {
		t.Fatalf("POST /reset: %d %s", code, body)
	}
	body, _ = fetch(t, "GET", base+"/explain"+q, "tok", "")
	if protojson.Unmarshal([]byte(body), &resp) != nil || resp.Explanations[0].Remaining != 3 {
		t.Errorf("after reset: %s", body)
	}

	// Without DebugReset there is no /reset.
	s2, stop2 := newTestServer(t, New(eng, nil, Options{}), server.Options{Engine: eng})
	defer stop2()
	if _, code := fetch(t, "POST", "http://"+s2.DebugAddr()+"/reset"+q, "", ""); code != http.StatusNotFound && code != http.StatusMethodNotAllowed {
		t.Errorf("POST /reset without DebugReset: %d", code)
	}
}

func entriesOf(kv ...string) []descriptors.Entry {
	var es []descriptors.Entry
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, descriptors.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return es
}
