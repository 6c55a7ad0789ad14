package authz

import (
	"slices"
	"strings"
	"testing"
)

const (
	rlsM     = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
	reserveM = "/charon.v1.Charon/Reserve"
	seizeM   = "/charon.v1.Charon/Seize"
	healthM  = "/grpc.health.v1.Health/Check"
)

func TestAllowed(t *testing.T) {
	tab, err := Parse([]byte(`
clients:
  - identity: spiffe://cluster.local/ns/istio-system/sa/gateway
    allow: [rls]
  - identity: spiffe://cluster.local/ns/jobs/*
    allow: [rls, reserve]
  - identity: ops.example.com
    allow: [/charon.v1.Charon/Seize]
  - identity: root
    allow: [all]
`))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		ids    []string
		method string
		want   bool
	}{
		{[]string{"spiffe://cluster.local/ns/istio-system/sa/gateway"}, rlsM, true},
		{[]string{"spiffe://cluster.local/ns/istio-system/sa/gateway"}, reserveM, false},
		{[]string{"spiffe://cluster.local/ns/istio-system/sa/gatewayX"}, rlsM, false},
		{[]string{"spiffe://cluster.local/ns/jobs/sa/worker"}, reserveM, true},
		{[]string{"spiffe://cluster.local/ns/jobs/sa/worker"}, "/charon.v1.Charon/Session", true},
		{[]string{"spiffe://cluster.local/ns/jobs/sa/worker"}, seizeM, false},
		{[]string{"spiffe://cluster.local/ns/jobsx"}, rlsM, false},
		{[]string{"x", "ops.example.com"}, seizeM, true},
		{[]string{"ops.example.com"}, rlsM, false},
		{[]string{"root"}, seizeM, true},
		{[]string{"root"}, "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", true},
		{nil, rlsM, false},
		{nil, healthM, true},
		{[]string{"stranger"}, reserveM, false},
	}
	for _, c := range cases {
		if got := tab.Allowed(c.ids, c.method); got != c.want {
			t.Errorf("Allowed(%v, %s) = %v, want %v", c.ids, c.method, got, c.want)
		}
	}
	if (&Table{}).Allowed([]string{"root"}, rlsM) {
		t.Error("the zero Table allows an RLS call")
	}
}

func TestParseErrors(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"clients:\n  - allow: [rls]\n", "clients[0].identity: missing"},
		{"clients:\n  - identity: a\n", "clients[0].allow: missing"},
		{"clients:\n  - identity: a\n    allow: [rls]\n  - identity: b\n    allow: [rls, reads]\n", `clients[1].allow[1] "reads"`},
		{"clients:\n  - identity: a*b\n    allow: [rls]\n", `clients[0].identity "a*b"`},
		{"clients:\n  - identity: a\n    allow: [/x]\n", `clients[0].allow[0] "/x"`},
		{"clients:\n  - identity: a\n    alow: [rls]\n", "field alow not found"},
		{"client: []\n", "field client not found"},
	} {
		_, err := Parse([]byte(c.in))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Parse(%q) = %v, want an error with %q", c.in, err, c.want)
		}
	}
	if tab, err := Parse(nil); err != nil || tab.Allowed([]string{"a"}, rlsM) {
		t.Errorf("empty table: %v, or it allows", err)
	}
}

// TestHTTPEndpoints: the HTTP endpoints' names fall in the groups the
// README names (read for the simulator and the debug port, admin for
// /reset), and a rule may name one alone.
func TestHTTPEndpoints(t *testing.T) {
	tab, err := Parse([]byte(`
clients:
  - identity: reader
    allow: [read]
  - identity: admin
    allow: [admin]
  - identity: gateway
    allow: [rls]
  - identity: scraper
    allow: [/charon.debug/Metrics]
  - identity: root
    allow: [all]
`))
	if err != nil {
		t.Fatal(err)
	}
	reads := []string{Simulator, DebugIndex, DebugMetrics, DebugRLConfig, DebugExplain, DebugTop, DebugPprof}
	for _, c := range []struct {
		id      string
		allowed []string
	}{
		{"reader", reads},
		{"admin", []string{DebugReset}},
		{"gateway", []string{ShouldRateLimit}},
		{"scraper", []string{DebugMetrics}},
		{"root", append([]string{DebugReset, ShouldRateLimit}, reads...)},
		{"stranger", nil},
	} {
		for _, m := range append([]string{DebugReset, ShouldRateLimit}, reads...) {
			if got, want := tab.Allowed([]string{c.id}, m), slices.Contains(c.allowed, m); got != want {
				t.Errorf("Allowed(%s, %s) = %v, want %v", c.id, m, got, want)
			}
		}
	}
}

func TestGroupOf(t *testing.T) {
	for m, want := range map[string]string{rlsM: "rls", reserveM: "reserve", seizeM: "admin", healthM: "health",
		"/charon.v1.Charon/Request": "rls", "/charon.v1.Charon/Usage": "read", "/x.Y/Z": "other",
		DebugMetrics: "read", DebugPprof: "read", Simulator: "read", DebugReset: "admin", DebugRLQS: "read",
		"/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas": "rlqs"} {
		if got := GroupOf(m); got != want {
			t.Errorf("GroupOf(%s) = %s, want %s", m, got, want)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("clients:\n  - identity: a*\n    allow: [rls, /a.B/C]\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		tab, err := Parse(b)
		if err == nil {
			tab.Allowed([]string{"a"}, rlsM)
		}
	})
}

// TestRLQSGroup: the rlqs group allows the RLQS stream and nothing else.
func TestRLQSGroup(t *testing.T) {
	tab, err := Parse([]byte("clients:\n  - identity: envoy\n    allow: [rlqs]\n"))
	if err != nil {
		t.Fatal(err)
	}
	const stream = "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas"
	if !tab.Allowed([]string{"envoy"}, stream) || tab.Allowed([]string{"envoy"}, ShouldRateLimit) || tab.Allowed([]string{"other"}, stream) {
		t.Error("rlqs allows the wrong methods or identities")
	}
}
