package rls

import (
	"context"
	"encoding/json"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/statsmap"
	"github.com/charonlimit/charon/server"
	"github.com/charonlimit/charon/tiers"
)

// scrapeLabels are labels of the dashboard's queries that the scrape adds,
// not the target: Envoy Gateway's Prometheus copies the pod's
// app.kubernetes.io/component label onto every series it scrapes.
var scrapeLabels = map[string]bool{"app_kubernetes_io_component": true}

// selector is one series selector of a PromQL expression: a metric name and
// its label matchers (name -> value, all "=" matchers).
type selector struct {
	name   string
	labels map[string]string
}

var (
	selectorRE = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{[^}]*\})?\s*(\()?`)
	matcherRE  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!=|!~|=)\s*"((?:[^"\\]|\\.)*)"`)
	promqlWord = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true,
		"group_right": true, "offset": true, "bool": true, "and": true, "or": true, "unless": true}
)

// dashboardSelectors reads a Grafana dashboard's PromQL expressions (every
// "expr" field) and returns their series selectors, its template variables
// replaced by their current values.
func dashboardSelectors(t *testing.T, file string) []selector {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Templating struct {
			List []struct {
				Name    string
				Current struct{ Value any }
			}
		}
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	var vars []string
	for _, v := range dash.Templating.List {
		if s, ok := v.Current.Value.(string); ok {
			vars = append(vars, "${"+v.Name+"}", s, "$"+v.Name, s)
		}
	}
	subst := strings.NewReplacer(vars...)
	var doc any
	json.Unmarshal(b, &doc)
	var exprs []string
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if s, ok := x.(string); ok && k == "expr" {
					exprs = append(exprs, subst.Replace(s))
				} else {
					walk(x)
				}
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(doc)
	var out []selector
	for _, e := range exprs {
		for _, m := range selectorRE.FindAllStringSubmatch(e, -1) {
			if m[3] == "(" || promqlWord[m[1]] {
				continue // a function or a keyword
			}
			sel := selector{name: m[1], labels: map[string]string{}}
			for _, lm := range matcherRE.FindAllStringSubmatch(m[2], -1) {
				if lm[2] != "=" {
					t.Fatalf("%s: matcher %s: only = is read", e, lm[0])
				}
				sel.labels[lm[1]] = lm[3]
			}
			out = append(out, sel)
		}
	}
	return out
}

// scraped reads a text exposition into series: name and labels.
func scraped(body string) []selector {
	var out []selector
	for _, line := range strings.Split(body, "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest, _ := strings.Cut(line, " ")
		labels := map[string]string{}
		if i := strings.IndexByte(line, '{'); i >= 0 && i < len(name) {
			name, rest = line[:i], line[i:]
			end := strings.LastIndexByte(rest, '}')
			for _, lm := range matcherRE.FindAllStringSubmatch(rest[:end+1], -1) {
				labels[lm[1]] = lm[3]
			}
		}
		out = append(out, selector{name: name, labels: labels})
	}
	return out
}

// egRoute is the descriptor Envoy Gateway's translator makes for the first
// match of an HTTPRoute rule: a key and value naming the route, then the
// rule's match.
func egRoute(rule string, limit *descriptors.Limit) *descriptors.Node {
	route := "httproute/default/http-ratelimit/rule/" + rule + "/match/0/ratelimit_example"
	return &descriptors.Node{Key: route, Value: route, Children: []*descriptors.Node{
		{Key: "rule-0-match-0", Value: "rule-0-match-0", Limit: limit},
	}}
}

// TestEnvoyGatewayDashboardSeries: with Envoy Gateway's statsd_exporter
// mapping (service/rls/testdata/envoygateway, vendored), after requests granted,
// over the limit and in shadow mode, the metrics address serves a series for
// every selector of its "Global Ratelimit" dashboard, with exactly the
// labels the selector names (but those the scrape adds), and the mapped
// shadow_mode and response time series.
func TestEnvoyGatewayDashboardSeries(t *testing.T) {
	const dir = "testdata/envoygateway/"
	ms, err := statsmap.Open(dir+"statsd_conf.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ms.Close() })
	perMin := func(n int64, shadow bool) *descriptors.Limit {
		return &descriptors.Limit{ShadowMode: shadow, Policy: &tiers.Policy{Kind: tiers.KindTiers,
			Tiers: []tiers.Tier{{Limit: n, Window: time.Minute, Active: tiers.Unbounded}}}}
	}
	const domain = "default/eg/http" // the dashboard's $DefaultDomain
	s := engineServer(t, domain, Options{MappedStats: ms}, server.Options{MetricsAddr: "127.0.0.1:0"},
		egRoute("0", perMin(2, false)), egRoute("1", perMin(1, true)))
	c := rlsv3.NewRateLimitServiceClient(dial(t, s.GRPCAddr()))
	ask := func(rule string) rlsv3.RateLimitResponse_Code {
		t.Helper()
		route := "httproute/default/http-ratelimit/rule/" + rule + "/match/0/ratelimit_example"
		resp, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain,
			Descriptors: []*ratelimitv3.RateLimitDescriptor{desc(route, route, "rule-0-match-0", "rule-0-match-0")}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.OverallCode
	}
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	if got := []rlsv3.RateLimitResponse_Code{ask("0"), ask("0"), ask("0"), ask("1"), ask("1")}; !slices.Equal(got, []rlsv3.RateLimitResponse_Code{ok, ok, over, ok, ok}) {
		t.Fatalf("answers %v, want OK OK OVER_LIMIT OK OK (the last one shadow)", got)
	}

	body, code := get(t, "http://"+s.MetricsAddr()+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	series := scraped(body)
	sels := dashboardSelectors(t, dir+"global-ratelimit.json")
	if len(sels) != 6 {
		t.Fatalf("%d selectors in the dashboard, want its 6: %v", len(sels), sels)
	}
	key1 := func(rule string) string {
		r := "httproute/default/http-ratelimit/rule/" + rule + "/match/0/ratelimit_example"
		return r + "_" + r
	}
	sels = append(sels,
		selector{"ratelimit_service_rate_limit_within_limit", map[string]string{"domain": domain, "key1": key1("0"), "key2": "rule-0-match-0_rule-0-match-0"}},
		selector{"ratelimit_service_rate_limit_shadow_mode", map[string]string{"domain": domain, "key1": key1("1"), "key2": "rule-0-match-0_rule-0-match-0"}},
		selector{"ratelimit_service_response_time_seconds_count", map[string]string{"grpc_method": "ShouldRateLimit"}},
		selector{"ratelimit_service_total_requests", map[string]string{"grpc_method": "ShouldRateLimit"}},
	)
	for _, sel := range sels {
		want := map[string]string{}
		for k, v := range sel.labels {
			if !scrapeLabels[k] {
				want[k] = v
			}
		}
		var names []string
		found := slices.ContainsFunc(series, func(s selector) bool {
			if s.name != sel.name {
				return false
			}
			names = append(names, strings.Join(slices.Sorted(maps.Keys(s.labels)), ","))
			return maps.Equal(s.labels, want)
		})
		if !found {
			t.Errorf("no series %s%v among %d scraped; that name has label sets %q", sel.name, want, len(series), names)
		}
	}
	if t.Failed() {
		t.Logf("scraped:\n%s", grepLines(body, "ratelimit_"))
	}
}
