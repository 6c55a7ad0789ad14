package engine

import (
	"context"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/tiers"
)

const explainConfig = `
domain: api
descriptors:
  - key: user
    tiers:
      - {limit: 5, window: 1s, active: unbounded}
      - {limit: 10, window: 1s, active: 5s, cooldown: 15s}
    overrides:
      - domain: vip
        tiers:
          - {limit: 100, window: 1s, active: unbounded}
  - key: health
    rate_limit: {unlimited: true}
  - key: report
    rate_limit: {unit: minute, requests_per_unit: 2}
    shadow_mode: true
`

func explainEngine(t *testing.T) (*Engine, *clock) {
	t.Helper()
	cfg, _, err := config.Load(fstest.MapFS{"api.yaml": {Data: []byte(explainConfig)}}, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := newClock()
	e := memEngine(t, c)
	e.SetTree(cfg.Tree)
	return e, c
}

func explain(t *testing.T, e *Engine, req *Request) []Explanation {
	t.Helper()
	xs, err := e.Explain(context.Background(), req)
	if err != nil {
		t.Fatalf("Explain: %v", err)
	}
	return xs
}

// TestExplainMatchesWhatRequestsMeet: after a burst into tier 2, Explain
// reports the leaf, tier 2 active until 5 s and cooling down until 20 s,
// Remaining hits that the next requests do get (and not one more), and
// the wait after which a request is granted again.
func TestExplainMatchesWhatRequestsMeet(t *testing.T) {
	e, c := explainEngine(t)
	user := func(v string) *Request { return &Request{Domain: "api", Descriptors: []Descriptor{desc("user", v)}} }
	for range 8 {
		wantCodes(t, "burst", ask(t, e, user("alice")), ok, ok)
	}
	c.Advance(500 * time.Millisecond)
	x := explain(t, e, user("alice"))[0]
	if !x.Limited || x.Override != "" || x.Match.Domain != "alice" || x.Match.Resource == "" || x.Match.Limit.File != "api.yaml" || x.Match.Limit.Line != 4 {
		t.Fatalf("explanation = %+v, want the user leaf at api.yaml:4, domain alice", x)
	}
	v := x.View
	if v.Tier != 2 || v.Tiers[1].Phase != tiers.PhaseActive || !v.Tiers[1].ActiveUntil.Equal(t0.Add(5*time.Second)) ||
		!v.Tiers[1].CooldownUntil.Equal(t0.Add(20*time.Second)) || v.DomainHits != 8 || v.Remaining != 7 {
		t.Fatalf("view = %+v, want tier 2 until 5s, cooling down to 20s, 8 hits in the last second, 7 remaining", v)
	}
	if !strings.Contains(x.Summary, "tier 2 of 2 (10 per 1s), 3 hits in its window: 7 more hits now; hits leave a window in 500ms") {
		t.Errorf("summary = %q", x.Summary)
	}
	// Explaining changed nothing: exactly Remaining more are granted.
	for range v.Remaining {
		wantCodes(t, "remaining", ask(t, e, user("alice")), ok, ok)
	}
	wantCodes(t, "past remaining", ask(t, e, user("alice")), over, over)
	x = explain(t, e, user("alice"))[0]
	if x.View.Remaining != 0 || x.View.RetryAfter != 500*time.Millisecond {
		t.Fatalf("after the window filled: %+v, want 0 remaining for 500ms", x.View)
	}
	c.Advance(x.View.RetryAfter)
	wantCodes(t, "at retry_after", ask(t, e, user("alice")), ok, ok)
	c.Advance(2 * time.Second)
	if x = explain(t, e, user("alice"))[0]; !strings.Contains(x.Summary, "tier 2 cools down in 2s, then tier 1: 5 per 1s") {
		t.Errorf("summary at 3s = %q", x.Summary)
	}

	// Another Charon domain of the same resource has its own state, and the
	// override's policy.
	x = explain(t, e, user("vip"))[0]
	if x.Override != OverrideDomain || x.Match.Policy.Tiers[0].Limit != 100 || x.View.Tier != 0 || x.View.Remaining != 100 {
		t.Errorf("vip = %+v, want the domain override, fresh", x)
	}
}

func TestExplainNotLimitedAndModes(t *testing.T) {
	e, _ := explainEngine(t)
	xs := explain(t, e, &Request{Domain: "api", Descriptors: []Descriptor{
		desc("health", "x"), desc("nothing", "x"), desc("report", "r"),
		{Entries: entries("user", "bob"), Override: &Override{RequestsPerUnit: 3, Unit: tiers.UnitMinute}},
	}})
	if xs[0].Limited || xs[0].Reason != ReasonUnlimited || xs[1].Limited || xs[1].Reason != ReasonNoMatch {
		t.Errorf("unlimited and unmatched: %+v %+v", xs[0], xs[1])
	}
	if !xs[2].Limited || !xs[2].Shadow || xs[2].View.Remaining != 2 {
		t.Errorf("shadow descriptor: %+v", xs[2])
	}
	if xs[3].Override != OverrideRequest || xs[3].View.Remaining != 3 {
		t.Errorf("request's own limit: %+v", xs[3])
	}
	xs = explain(t, e, &Request{Domain: "nope", Descriptors: []Descriptor{desc("user", "bob")}})
	if xs[0].Limited || xs[0].Reason != ReasonUnknownDomain {
		t.Errorf("unknown domain: %+v", xs[0])
	}
	if _, err := e.Explain(context.Background(), &Request{Domain: "", Descriptors: []Descriptor{desc("user", "bob")}}); err == nil {
		t.Error("Explain of a request without a domain: no error")
	}
}

func TestResetPair(t *testing.T) {
	e, _ := explainEngine(t)
	req := func(v string) *Request { return &Request{Domain: "api", Descriptors: []Descriptor{desc("user", v)}} }
	for range 15 {
		ask(t, e, req("alice"))
		ask(t, e, req("bob"))
	}
	wantCodes(t, "alice full", ask(t, e, req("alice")), over, over)
	n, err := e.Reset(context.Background(), &Request{Domain: "api", Descriptors: []Descriptor{desc("user", "alice"), desc("health", "x")}})
	if err != nil || n != 1 {
		t.Fatalf("Reset = %d, %v; want 1 pair", n, err)
	}
	if x := explain(t, e, req("alice"))[0]; x.View.Tier != 0 || x.View.DomainHits != 0 {
		t.Errorf("alice after reset: %+v", x.View)
	}
	wantCodes(t, "alice after reset", ask(t, e, req("alice")), ok, ok)
	wantCodes(t, "bob untouched", ask(t, e, req("bob")), over, over)
}
