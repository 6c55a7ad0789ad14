package engine

import (
	"strconv"
	"testing"
	"testing/fstest"
	"time"

	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/tiers"
)

// Counts belong to the rule (SPEC §3): the keys the engine hands the store
// hold the rule and its policy's shape, never its limits.

func loadTree(t *testing.T, yaml string) *descriptors.Tree {
	t.Helper()
	cfg, _, err := config.Load(fstest.MapFS{"rl.yaml": {Data: []byte(yaml)}}, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Tree
}

// TestReloadKeepsCounts: a reload changes numbers mid-window; the new
// numbers apply to the count already made. A change of shape starts afresh.
func TestReloadKeepsCounts(t *testing.T) {
	const head = "domain: web\ndescriptors:\n  - key: user\n"
	for _, tc := range []struct {
		name          string
		before, after string
		used          int    // requests of one hit granted under before
		hits          uint32 // hits_addend of each request (0: 1)
		want          []Code // the requests after the reload
	}{
		{"a limit raised grants exactly the difference",
			"    rate_limit: {unit: minute, requests_per_unit: 5}\n",
			"    rate_limit: {unit: minute, requests_per_unit: 6}\n",
			5, 0, []Code{ok, over}},
		{"a limit lowered below the count rejects",
			"    rate_limit: {unit: minute, requests_per_unit: 5}\n",
			"    rate_limit: {unit: minute, requests_per_unit: 3}\n",
			4, 0, []Code{over}},
		{"a fixed window raised",
			"    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: fixed_window}\n",
			"    rate_limit: {unit: minute, requests_per_unit: 7, algorithm: fixed_window}\n",
			5, 0, []Code{ok, ok, over}},
		{"the current tier raised",
			"    tiers: [{limit: 2, window: 1m}, {limit: 5, window: 1m, active: 10m}]\n",
			"    tiers: [{limit: 2, window: 1m}, {limit: 6, window: 1m, active: 10m, cooldown: 1h}]\n",
			7, 0, []Code{ok, over}},
		{"a token bucket's capacity raised",
			"    token_bucket: {capacity: 5, refill: 1, per: 1h}\n",
			"    token_bucket: {capacity: 6, refill: 1, per: 1h}\n",
			5, 0, []Code{ok, over}},
		{"a hard limit raised",
			"    hard_limit: 2\n    rate_limit: {unit: minute, requests_per_unit: 100}\n",
			"    hard_limit: 3\n    rate_limit: {unit: minute, requests_per_unit: 100}\n",
			2, 0, []Code{ok, over}},
		{"post-paid counting selected",
			"    rate_limit: {unit: minute, requests_per_unit: 5}\n",
			"    rate_limit: {unit: minute, requests_per_unit: 5}\n    overdraft: true\n",
			4, 0, []Code{ok, over}},
		{"a quota plan raised mid-month leaves the difference",
			"    quota: {limit: 1000, period: month}\n",
			"    quota: {limit: 5000, period: month}\n",
			// 4100 of 5000 left: four requests of 900 fit, a fifth does not.
			1, 900, []Code{ok, ok, ok, ok, over}},
		{"a quota beside a rate limit keeps its count when the rate changes",
			"    rate_limit: {unit: second, requests_per_unit: 1000}\n    quota: {limit: 10, period: day}\n",
			"    rate_limit: {unit: second, requests_per_unit: 2000}\n    quota: {limit: 10, period: day}\n",
			10, 0, []Code{over}},
		{"a window's unit changed starts afresh",
			"    rate_limit: {unit: minute, requests_per_unit: 5}\n",
			"    rate_limit: {unit: hour, requests_per_unit: 5}\n",
			5, 0, []Code{ok, ok, ok, ok, ok, over}},
		{"the algorithm changed starts afresh",
			"    rate_limit: {unit: minute, requests_per_unit: 2}\n",
			"    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: fixed_window}\n",
			2, 0, []Code{ok, ok, over}},
		{"a quota's period changed starts afresh",
			"    quota: {limit: 3, period: month}\n",
			"    quota: {limit: 3, period: day}\n",
			3, 0, []Code{ok, ok, ok, over}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newClock()
			// Midway through a month, away from a minute's start: a fixed
			// window's and a quota's period hold the whole test.
			c.now = time.Date(2030, 1, 15, 12, 0, 10, 0, time.UTC)
			e := memEngine(t, c)
			e.SetTree(loadTree(t, head+tc.before))
			req := &Request{Domain: "web", Descriptors: []Descriptor{desc("user", "alice")}, Hits: tc.hits}
			for range tc.used {
				wantCodes(t, "before the reload", ask(t, e, req), ok, ok)
			}
			c.Advance(100 * time.Millisecond)
			e.SetTree(loadTree(t, head+tc.after))
			for i, want := range tc.want {
				r := ask(t, e, req)
				if r.Code != want {
					t.Fatalf("request %d after the reload: %v, want %v (statuses %+v)", i+1, r.Code, want, r.Statuses)
				}
			}
		})
	}
}

// TestOverrideLimitsKeepCounts: a domain's override whose limit changes
// (or a new override of the default's shape, a customer moved to another
// plan) applies to the count the domain has; the other domains keep theirs.
func TestOverrideLimitsKeepCounts(t *testing.T) {
	c := newClock()
	e := memEngine(t, c)
	base := "domain: web\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 2}\n"
	e.SetTree(loadTree(t, base))
	req := func(u string) *Request { return &Request{Domain: "web", Descriptors: []Descriptor{desc("user", u)}} }
	for _, u := range []string{"alice", "alice", "bob", "bob"} {
		wantCodes(t, u, ask(t, e, req(u)), ok, ok)
	}
	e.SetTree(loadTree(t, base+"    overrides: [{domain: alice, rate_limit: {unit: minute, requests_per_unit: 3}}]\n"))
	wantCodes(t, "alice, moved to 3 a minute", ask(t, e, req("alice")), ok, ok)
	wantCodes(t, "alice again", ask(t, e, req("alice")), over, over)
	wantCodes(t, "bob, still at 2", ask(t, e, req("bob")), over, over)
	e.SetTree(loadTree(t, base+"    overrides: [{domain: alice, rate_limit: {unit: minute, requests_per_unit: 4}}]\n"))
	wantCodes(t, "alice, moved to 4 a minute", ask(t, e, req("alice")), ok, ok)
	wantCodes(t, "alice at 4", ask(t, e, req("alice")), over, over)
}

// TestRequestLimitKeepsCount: a request's own limit (Envoy's per-descriptor
// limit, Envoy Gateway's limit.fromMetadata) that differs from the last one
// applies to the count made under it; another unit is another shape.
func TestRequestLimitKeepsCount(t *testing.T) {
	c := newClock()
	e := memEngine(t, c)
	req := func(n uint32, u tiers.Unit) *Request {
		d := desc("tenant", "acme")
		d.Override = &Override{RequestsPerUnit: n, Unit: u}
		return &Request{Domain: "test", Descriptors: []Descriptor{d}}
	}
	for range 5 {
		wantCodes(t, "5 a minute", ask(t, e, req(5, tiers.UnitMinute)), ok, ok)
	}
	wantCodes(t, "the 6th of 5", ask(t, e, req(5, tiers.UnitMinute)), over, over)
	wantCodes(t, "raised to 6: one more", ask(t, e, req(6, tiers.UnitMinute)), ok, ok)
	wantCodes(t, "6 of 6", ask(t, e, req(6, tiers.UnitMinute)), over, over)
	wantCodes(t, "lowered to 4", ask(t, e, req(4, tiers.UnitMinute)), over, over)
	wantCodes(t, "per hour: another shape, afresh", ask(t, e, req(1, tiers.UnitHour)), ok, ok)
}

// TestMatchShape: a match's shape is its policy's (the override's for an
// overridden domain), the same whatever the limits, another for another
// window; the quota's key is its shape too.
func TestMatchShape(t *testing.T) {
	tree := func(limit, vip int, unit string) *descriptors.Tree {
		return loadTree(t, "domain: web\ndescriptors:\n  - key: user\n"+
			"    rate_limit: {unit: "+unit+", requests_per_unit: "+strconv.Itoa(limit)+"}\n"+
			"    overrides: [{domain: vip, rate_limit: {unit: hour, requests_per_unit: "+strconv.Itoa(vip)+"}}]\n"+
			"    quota: {limit: "+strconv.Itoa(limit*100)+", period: month}\n")
	}
	match := func(tr *descriptors.Tree, u string) descriptors.Match {
		m, ok := tr.Match("web", entries("user", u))
		if !ok {
			t.Fatalf("%s: no match", u)
		}
		return m
	}
	a, b, other := tree(5, 50, "minute"), tree(6, 60, "minute"), tree(5, 50, "second")
	if x, y := match(a, "alice"), match(b, "alice"); x.Shape == 0 || x.Shape != y.Shape {
		t.Errorf("alice's shape under 5 and 6 a minute: %x, %x; want one, not 0", x.Shape, y.Shape)
	}
	if x, y := match(a, "vip"), match(b, "vip"); x.Shape != y.Shape || x.Shape == match(a, "alice").Shape {
		t.Errorf("vip's shape (an hourly override): %x under 50, %x under 60, alice's %x; want one, not alice's", x.Shape, y.Shape, match(a, "alice").Shape)
	}
	if match(other, "alice").Shape == match(a, "alice").Shape {
		t.Error("a window of a second and one of a minute share a shape")
	}
	if x, y := match(a, "alice").Limit.QuotaID, match(b, "alice").Limit.QuotaID; x != y || x == match(a, "alice").Shape {
		t.Errorf("quota keys %x, %x under 500 and 600 a month; want one, not the rate's %x", x, y, match(a, "alice").Shape)
	}
}

// TestCalendarUnits: under calendar units a monthly limit renews on the 1st
// at midnight of the zone (not 30 days on), a daily one at each midnight
// (a day of 23 hours across the spring DST change), and a request's own
// limit in months counts per calendar month too, in the configured
// limit's state when that is a month of the same zone; its answer names
// the unit.
func TestCalendarUnits(t *testing.T) {
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Fatal(err)
	}
	cfg, _, err := config.Load(fstest.MapFS{"rl.yaml": {Data: []byte(`domain: ai
descriptors:
  - key: tenant
    rate_limit: {unit: month, requests_per_unit: 3, name: monthly}
  - key: user
    rate_limit: {unit: day, requests_per_unit: 2}
`)}}, config.Options{CalendarUnits: paris})
	if err != nil {
		t.Fatal(err)
	}
	c := newClock()
	e := memEngine(t, c)
	e.SetTree(cfg.Tree)
	tenant := &Request{Domain: "ai", Descriptors: []Descriptor{desc("tenant", "acme")}}
	// January 31st, 23:59 in Paris (22:59 UTC).
	c.now = time.Date(2030, 1, 31, 23, 59, 0, 0, paris)
	for range 3 {
		wantCodes(t, "January", ask(t, e, tenant), ok, ok)
	}
	r := ask(t, e, tenant)
	wantCodes(t, "January's fourth", r, over, over)
	if st := r.Statuses[0]; st.ResetAfter != time.Minute || st.Limit == nil || st.Limit.Unit != tiers.UnitMonth || st.Limit.RequestsPerUnit != 3 || st.Limit.Name != "monthly" {
		t.Errorf("January's fourth: reset after %v, limit %+v; want a minute (February 1st in Paris), 3 per month named monthly", st.ResetAfter, st.Limit)
	}
	c.now = time.Date(2030, 2, 1, 0, 0, 0, 0, paris)
	wantCodes(t, "February 1st, midnight in Paris", ask(t, e, tenant), ok, ok)

	// The last Sunday of March 2030 in Paris has 23 hours.
	user := &Request{Domain: "ai", Descriptors: []Descriptor{desc("user", "bob")}}
	c.now = time.Date(2030, 3, 31, 0, 30, 0, 0, paris)
	wantCodes(t, "the DST day", ask(t, e, user), ok, ok)
	wantCodes(t, "the DST day", ask(t, e, user), ok, ok)
	r = ask(t, e, user)
	wantCodes(t, "the DST day's third", r, over, over)
	if got := r.Statuses[0].ResetAfter; got != 22*time.Hour+30*time.Minute {
		t.Errorf("the DST day's third: reset after %v, want 22h30m (a day of 23 hours)", got)
	}

	// A request's own limit of 4 a month counts in the configured month:
	// February's one request is counted, three more fit.
	c.now = time.Date(2030, 2, 10, 12, 0, 0, 0, paris)
	own := func(n uint32, u tiers.Unit) *Request {
		d := desc("tenant", "acme")
		d.Override = &Override{RequestsPerUnit: n, Unit: u}
		return &Request{Domain: "ai", Descriptors: []Descriptor{d}}
	}
	for range 3 {
		wantCodes(t, "4 a month", ask(t, e, own(4, tiers.UnitMonth)), ok, ok)
	}
	wantCodes(t, "the fifth of 4 a month", ask(t, e, own(4, tiers.UnitMonth)), over, over)
	// A month of another domain without calendar units would be 30 days;
	// here a day of a request's own limit is a calendar day.
	c.now = time.Date(2030, 2, 10, 23, 59, 0, 0, paris)
	wantCodes(t, "1 a day", ask(t, e, own(1, tiers.UnitDay)), ok, ok)
	wantCodes(t, "1 a day, again", ask(t, e, own(1, tiers.UnitDay)), over, over)
	c.now = time.Date(2030, 2, 11, 0, 0, 0, 0, paris)
	wantCodes(t, "1 a day, the next calendar day", ask(t, e, own(1, tiers.UnitDay)), ok, ok)
}
