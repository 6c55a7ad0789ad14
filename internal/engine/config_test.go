package engine

import (
	"testing"
	"testing/fstest"
	"time"

	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/tiers"
)

// TestLyftConfig runs a envoyproxy/ratelimit configuration, loaded by the
// config package, through the pipeline.
func TestLyftConfig(t *testing.T) {
	fsys := fstest.MapFS{"rl.yaml": {Data: []byte(`
domain: web
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 2
  - key: path
    value: /login
    rate_limit:
      name: login
      unit: minute
      requests_per_unit: 1
  - key: path
    value: /health
    rate_limit:
      unlimited: true
`)}}
	cfg, _, err := config.Load(fsys, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := newClock()
	e := memEngine(t, c)
	e.SetTree(cfg.Tree)
	web := func(kv ...string) *Request { return &Request{Domain: "web", Descriptors: []Descriptor{desc(kv...)}} }

	wantCodes(t, "1st", ask(t, e, web("remote_address", "10.0.0.1")), ok, ok)
	wantCodes(t, "2nd", ask(t, e, web("remote_address", "10.0.0.1")), ok, ok)
	wantCodes(t, "3rd", ask(t, e, web("remote_address", "10.0.0.1")), over, over)
	wantCodes(t, "other address", ask(t, e, web("remote_address", "10.0.0.2")), ok, ok)

	r := ask(t, e, web("path", "/login"))
	wantCodes(t, "login", r, ok, ok)
	if l := r.Statuses[0].Limit; l == nil || *l != (CurrentLimit{1, tiers.UnitMinute, 0, "login"}) {
		t.Errorf("login limit = %+v, want 1 per minute named login", l)
	}
	wantCodes(t, "login again", ask(t, e, web("path", "/login")), over, over)
	r = ask(t, e, web("path", "/health"))
	wantCodes(t, "health", r, ok, ok)
	if r.Statuses[0].Limit != nil {
		t.Errorf("unlimited descriptor reports limit %+v", r.Statuses[0].Limit)
	}
	c.Advance(time.Minute)
	wantCodes(t, "login a minute later", ask(t, e, web("path", "/login")), ok, ok)
	wantCodes(t, "address a minute later", ask(t, e, web("remote_address", "10.0.0.1")), ok, ok)
}
