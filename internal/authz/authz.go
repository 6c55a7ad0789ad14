// Package authz is the authorization table of `charon serve`: which client
// identities (names in their verified TLS certificates) may call which gRPC
// methods, and which HTTP endpoints, named like methods, they may reach. It
// knows method names, not gRPC or HTTP; the server applies it.
package authz

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// ShouldRateLimit is Envoy's decision method, also the name under which the
// HTTP port's /json is allowed: it asks the same question.
const ShouldRateLimit = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// The other HTTP endpoints the table governs, named like methods so that a
// rule may allow them by group or one by one (a scraper may be given
// DebugMetrics alone). The HTTP port's /healthcheck needs no rule.
const (
	// Simulator is the HTTP port's tier simulator, /sim/.
	Simulator = "/charon.http/Simulator"
	// Usage is the HTTP port's GET /usage: how much of its limits and
	// quotas a caller has used.
	Usage = "/charon.http/Usage"
	// DebugIndex is the debug port's index, /.
	DebugIndex = "/charon.debug/Index"
	// DebugMetrics is the debug port's /metrics.
	DebugMetrics = "/charon.debug/Metrics"
	// DebugRLConfig is the debug port's /rlconfig: the configuration.
	DebugRLConfig = "/charon.debug/RLConfig"
	// DebugExplain is the debug port's GET /explain.
	DebugExplain = "/charon.debug/Explain"
	// DebugTop is the debug port's GET /top and the page at /ui/: who is
	// being limited, by which rule.
	DebugTop = "/charon.debug/Top"
	// DebugRLQS is the debug port's GET /rlqs: the quota shares.
	DebugRLQS = "/charon.debug/RLQS"
	// DebugPprof is the debug port's /debug/pprof/ profiles.
	DebugPprof = "/charon.debug/Pprof"
	// DebugReset is the debug port's POST /reset: it forgets pairs' state.
	DebugReset = "/charon.debug/Reset"
)

// The method groups a rule may allow. Health checks are always allowed.
var groups = map[string][]string{
	// rls: rate-limit decisions, Envoy's (over gRPC and HTTP /json) and
	// charon.v1's bulk Request.
	"rls": {ShouldRateLimit, "/charon.v1.Charon/Request"},
	// read: what changes nothing (server reflection, Explain, Usage, the
	// simulator, the debug port's endpoints but /reset).
	"read": {"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
		"/charon.v1.Charon/Explain", "/charon.v1.Charon/Usage", Simulator, Usage, DebugIndex, DebugMetrics, DebugRLConfig, DebugExplain, DebugTop, DebugRLQS, DebugPprof},
	// rlqs: Envoy's rate_limit_quota stream (usage in, quota out).
	"rlqs": {"/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas"},
	// reserve: taking and giving back copies of one's own session.
	"reserve": {"/charon.v1.Charon/Reserve", "/charon.v1.Charon/Release", "/charon.v1.Charon/Transfer",
		"/charon.v1.Charon/KeepAlive", "/charon.v1.Charon/Session"},
	// admin: taking copies from others, forgetting pairs' state.
	"admin": {"/charon.v1.Charon/Seize", DebugReset},
}

// Groups are the names a rule's allow list may use besides method names.
var Groups = []string{"rls", "read", "reserve", "admin", "rlqs", "all"}

// alwaysAllowed methods need no rule: probes do not carry identities.
var alwaysAllowed = []string{"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch", "/grpc.health.v1.Health/List"}

// GroupOf names the group of a full method name ("/pkg.Service/Method"):
// one of Groups without "all", "health", or "other".
func GroupOf(method string) string {
	if slices.Contains(alwaysAllowed, method) {
		return "health"
	}
	for _, g := range Groups[:len(Groups)-1] {
		if slices.Contains(groups[g], method) {
			return g
		}
	}
	return "other"
}

// Table is a parsed authorization table. The zero Table allows nothing but
// health checks.
type Table struct {
	rules []rule
}

type rule struct {
	identity string // exact, or a prefix ending in '*'
	all      bool
	methods  []string
}

func (r rule) matches(id string) bool {
	if p, ok := strings.CutSuffix(r.identity, "*"); ok {
		return strings.HasPrefix(id, p)
	}
	return id == r.identity
}

// file is the YAML form.
type file struct {
	Clients []struct {
		Identity string   `yaml:"identity"`
		Allow    []string `yaml:"allow"`
	} `yaml:"clients"`
}

// Parse reads a table:
//
//	clients:
//	  - identity: spiffe://cluster.local/ns/istio-system/sa/istio-ingressgateway-service-account
//	    allow: [rls]
//	  - identity: spiffe://cluster.local/ns/jobs/*   # a trailing * matches a prefix
//	    allow: [rls, reserve, /charon.v1.Charon/Seize]
//
// An error names the field at fault (clients[1].allow[0]).
func Parse(b []byte) (*Table, error) {
	var f file
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("authz: %v", err)
	}
	t := &Table{}
	for i, c := range f.Clients {
		at := fmt.Sprintf("clients[%d]", i)
		if c.Identity == "" {
			return nil, fmt.Errorf("authz: %s.identity: missing", at)
		}
		if strings.Contains(strings.TrimSuffix(c.Identity, "*"), "*") {
			return nil, fmt.Errorf("authz: %s.identity %q: '*' only at the end", at, c.Identity)
		}
		if len(c.Allow) == 0 {
			return nil, fmt.Errorf("authz: %s.allow: missing (a list of %s, or /service/method names)", at, strings.Join(Groups, ", "))
		}
		r := rule{identity: c.Identity}
		for j, a := range c.Allow {
			switch {
			case a == "all":
				r.all = true
			case groups[a] != nil:
				r.methods = append(r.methods, groups[a]...)
			case strings.HasPrefix(a, "/") && strings.Count(a, "/") == 2 && !strings.HasSuffix(a, "/"):
				r.methods = append(r.methods, a)
			default:
				return nil, fmt.Errorf("authz: %s.allow[%d] %q: want one of %s, or a /service/method name", at, j, a, strings.Join(Groups, ", "))
			}
		}
		t.rules = append(t.rules, r)
	}
	return t, nil
}

// Allowed reports whether a client with these identities may call method
// (a full gRPC method name, or one of the HTTP endpoints' names above).
// Rules add up: any rule matching any identity that allows the method
// allows it.
func (t *Table) Allowed(ids []string, method string) bool {
	if slices.Contains(alwaysAllowed, method) {
		return true
	}
	for _, r := range t.rules {
		if !r.all && !slices.Contains(r.methods, method) {
			continue
		}
		for _, id := range ids {
			if r.matches(id) {
				return true
			}
		}
	}
	return false
}
