package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

var promql = parser.NewParser(parser.Options{})

// grafanaVars are the values Grafana gives its variables, for parsing.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__range", "1h", "$domain", ".*")

// metricNames parses expr and returns the metric names it selects.
func metricNames(t *testing.T, where, expr string) []string {
	t.Helper()
	e, err := promql.ParseExpr(expr)
	if err != nil {
		t.Errorf("%s: %q: %v", where, expr, err)
		return nil
	}
	var names []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			name := vs.Name
			for _, m := range vs.LabelMatchers {
				if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
					name = m.Value
				}
			}
			if name == "" {
				t.Errorf("%s: %q selects no metric by name", where, expr)
			}
			names = append(names, name)
		}
		return nil
	})
	return names
}

// dashboardExprs returns every query of a Grafana dashboard, by panel title.
func dashboardExprs(t *testing.T, path string) map[string][]string {
	t.Helper()
	var d struct {
		UID    string `json:"uid"`
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	dec := json.NewDecoder(bytes.NewReader(readFile(t, path)))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if d.UID == "" || d.Title == "" || len(d.Panels) == 0 {
		t.Errorf("%s: uid %q, title %q, %d panels", path, d.UID, d.Title, len(d.Panels))
	}
	out := map[string][]string{}
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("%s: panel %q has no query", path, p.Title)
		}
		for _, tg := range p.Targets {
			out[p.Title] = append(out[p.Title], grafanaVars.Replace(tg.Expr))
		}
	}
	return out
}

// alertRules parses a Prometheus rule file as Prometheus does (strictly,
// each expression and template checked).
func alertRules(t *testing.T, path string) *rulefmt.RuleGroups {
	t.Helper()
	groups, errs := rulefmt.Parse(readFile(t, path), false, model.UTF8Validation, promql, slog.New(slog.NewTextHandler(io.Discard, nil)))
	for _, err := range errs {
		t.Errorf("%s: %v", path, err)
	}
	if groups == nil || len(groups.Groups) == 0 {
		t.Fatalf("%s: no rule groups", path)
	}
	return groups
}

// monitoringMetrics returns the metric names every dashboard and alert
// queries, with where each is used; it fails on an expression that does
// not parse.
func monitoringMetrics(t *testing.T) map[string][]string {
	t.Helper()
	used := map[string][]string{}
	dashboards, _ := filepath.Glob("grafana/*.json")
	if len(dashboards) != 2 {
		t.Fatalf("dashboards %v, want charon.json and ratelimit.json", dashboards)
	}
	for _, path := range dashboards {
		for title, exprs := range dashboardExprs(t, path) {
			for _, e := range exprs {
				for _, n := range metricNames(t, path+": "+title, e) {
					used[n] = append(used[n], path)
				}
			}
		}
	}
	groups := alertRules(t, "prometheus/charon-alerts.yaml")
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" || r.Annotations["summary"] == "" || r.Labels["severity"] == "" {
				t.Errorf("rule %q: an alert needs a name, a summary and a severity", r.Alert)
			}
			for _, n := range metricNames(t, "alert "+r.Alert, r.Expr) {
				used[n] = append(used[n], "alert "+r.Alert)
			}
		}
	}
	return used
}

// TestMonitoringQueriesParse: every dashboard query and alert expression
// parses with Prometheus' own parser.
func TestMonitoringQueriesParse(t *testing.T) {
	if used := monitoringMetrics(t); len(used) < 20 {
		t.Errorf("%d metrics queried, want more: %v", len(used), used)
	}
}

// eventOnly are the metrics a running server exports only once something
// rare has happened (their series are born with their first label values).
var eventOnly = map[string]string{
	"charon_authz_denied_total":                 "a call refused by --authz (mutual TLS and a table)",
	"ratelimit_service_should_rate_limit_error": "a failed ShouldRateLimit call",
}

// histograms are queried by their series' names.
var seriesSuffix = regexp.MustCompile(`_(bucket|sum|count)$`)

// TestMonitoringMetricsExist: every metric the dashboards and alerts query
// is served by a running `charon serve` (Redis store, decision log, debug
// token, a copy-limited resource), after traffic, or is one of the few
// born of a rare event, listed in docs/metrics.md.
func TestMonitoringMetricsExist(t *testing.T) {
	redis, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CHARON_REQUIRE_REDIS") != "" {
			t.Fatal("no redis-server, and CHARON_REQUIRE_REDIS is set (CI sets it)")
		}
		t.Skip("no redis-server (apt-get install -y redis-server)")
	}
	used := monitoringMetrics(t)
	dir := t.TempDir()
	ports := freePorts(t, 4)
	rs := exec.Command(redis, "--port", ports[0], "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	if err := rs.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Process.Kill(); rs.Wait() })
	cfg := filepath.Join(dir, "config")
	os.Mkdir(cfg, 0o755)
	os.WriteFile(filepath.Join(cfg, "api.yaml"), []byte(`domain: api
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 1}
    shadow_mode: true
  - key: seat
    copies: {domain_limit: 1}
`), 0o644)
	os.WriteFile(filepath.Join(dir, "token"), []byte("t0ken"), 0o600)
	grpcAddr, httpAddr, debugAddr := "127.0.0.1:"+ports[1], "127.0.0.1:"+ports[2], "127.0.0.1:"+ports[3]
	var stderr bytes.Buffer
	cmd := exec.Command(charonBin(t), "serve", "--config", cfg, "--store", "redis", "--redis-url", "redis://127.0.0.1:"+ports[0],
		"--grpc-addr", grpcAddr, "--http-addr", httpAddr, "--debug-addr", debugAddr, "--shutdown-delay=0s",
		"--decision-log", filepath.Join(dir, "decisions.jsonl"), "--debug-token-file", filepath.Join(dir, "token"))
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	waitFor(t, func() bool {
		_, code := httpDo(t, "GET", "http://"+httpAddr+"/healthcheck", "", "")
		return code == 200
	}, &stderr)

	for _, body := range []string{
		`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"alice"}]}]}`,
		`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"alice"}]}]}`,
		`{"domain":"api","descriptors":[{"entries":[{"key":"tenant","value":"t"}]}]}`,
		`{"domain":"api","descriptors":[{"entries":[{"key":"tenant","value":"t"}]}]}`,
		`{"domain":"api","descriptors":[{"entries":[]}]}`,
	} {
		httpDo(t, "POST", "http://"+httpAddr+"/json", "", body)
	}
	if out, err := exec.Command(charonBin(t), "reserve", "--addr", grpcAddr, "--domain", "api", "--descriptor", "seat=s1", "--hold-for", "1ms").CombinedOutput(); err != nil {
		t.Fatalf("charon reserve: %v\n%s", err, out)
	}
	httpDo(t, "GET", "http://"+debugAddr+"/metrics", "wrong", "")

	var metrics string
	waitFor(t, func() bool {
		// Decision log lines are counted by a writer goroutine.
		metrics, _ = httpDo(t, "GET", "http://"+debugAddr+"/metrics", "t0ken", "")
		return strings.Contains(metrics, `charon_decision_log_lines_total{outcome="written"} `) &&
			!strings.Contains(metrics, `charon_decision_log_lines_total{outcome="written"} 0`)
	}, &stderr)
	served := map[string]bool{}
	for _, line := range strings.Split(metrics, "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		name, _, _ := strings.Cut(line, "{")
		name, _, _ = strings.Cut(name, " ")
		served[name] = true
		served[seriesSuffix.ReplaceAllString(name, "")] = true
	}
	docs := string(readFile(t, "../docs/metrics.md"))
	var missing []string
	for name, where := range used {
		if served[name] {
			continue
		}
		if why, ok := eventOnly[name]; ok {
			if !strings.Contains(docs, name) {
				t.Errorf("%s (born of %s) is not in docs/metrics.md", name, why)
			}
			continue
		}
		missing = append(missing, fmt.Sprintf("%s (%s)", name, strings.Join(slices.Compact(slices.Sorted(slices.Values(where))), ", ")))
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("queried but not served by a running server:\n%s", strings.Join(missing, "\n"))
	}
}

func freePorts(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	var ls []net.Listener
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		_, p, _ := net.SplitHostPort(l.Addr().String())
		out = append(out, p)
	}
	for _, l := range ls {
		l.Close()
	}
	return out
}

func httpDo(t *testing.T, method, url, token, body string) (string, int) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err.Error(), 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b), resp.StatusCode
}

// waitFor polls cond until it holds, for at most 20 s.
func waitFor(t *testing.T, cond func() bool, stderr *bytes.Buffer) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met in time\n%s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestHelmMonitoring: off by default; on, the chart's ConfigMap carries
// Grafana's sidecar label and the dashboards of deploy/grafana, and its
// PrometheusRule the rules of deploy/prometheus, byte for byte.
func TestHelmMonitoring(t *testing.T) {
	for _, f := range []string{"grafana/charon.json", "grafana/ratelimit.json", "prometheus/charon-alerts.yaml"} {
		if !bytes.Equal(readFile(t, f), readFile(t, "helm/charon/files/"+f)) {
			t.Errorf("helm/charon/files/%s differs from %s: copy it", f, f)
		}
	}
	c := loadChart(t)
	objs, err := render(t, c, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.kind == "PrometheusRule" || o.name == "charon-dashboards" {
			t.Errorf("rendered by default: %s %s", o.kind, o.name)
		}
	}
	objs, err = render(t, c, "dashboards:\n  enabled: true\n  annotations:\n    grafana_folder: Charon\nalerts:\n  prometheusRule:\n    enabled: true\n    labels:\n      release: kube-prometheus-stack\n")
	if err != nil {
		t.Fatal(err)
	}
	cm, ok := find[*corev1.ConfigMap](objs, "ConfigMap", "charon-dashboards")
	if !ok {
		t.Fatal("no ConfigMap charon-dashboards")
	}
	if cm.Labels["grafana_dashboard"] != "1" || cm.Annotations["grafana_folder"] != "Charon" {
		t.Errorf("dashboards ConfigMap labels %v, annotations %v", cm.Labels, cm.Annotations)
	}
	for _, f := range []string{"charon.json", "ratelimit.json"} {
		// The ConfigMap's block scalar may end with one more newline.
		if strings.TrimSpace(cm.Data[f]) != strings.TrimSpace(string(readFile(t, "grafana/"+f))) {
			t.Errorf("ConfigMap data %s differs from grafana/%s", f, f)
		}
	}
	pr, ok := find[*monitoringv1.PrometheusRule](objs, "PrometheusRule", "charon")
	if !ok {
		t.Fatal("no PrometheusRule charon")
	}
	if pr.Labels["release"] != "kube-prometheus-stack" {
		t.Errorf("PrometheusRule labels %v", pr.Labels)
	}
	var want monitoringv1.PrometheusRuleSpec
	if err := yaml.UnmarshalStrict(readFile(t, "prometheus/charon-alerts.yaml"), &want); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, pr.Spec); diff != "" || len(pr.Spec.Groups) == 0 || len(pr.Spec.Groups[0].Rules) < 8 {
		t.Errorf("PrometheusRule spec (-file +chart):\n%s", diff)
	}
}
