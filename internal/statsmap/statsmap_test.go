package statsmap

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// mapping is a cut of envoyproxy/ratelimit's default mapping, with a summary
// and a drop.
const mapping = `
mappings:
  - match: "ratelimit.service.rate_limit.*.*.total_hits"
    name: "ratelimit_service_rate_limit_total_hits"
    timer_type: "histogram"
    labels:
      domain: "$1"
      key1: "$2"
  - match: "ratelimit\\.service\\.rate_limit\\.([^\\.]*)\\.([^\\.]*)\\.([^\\.]*)(\\..*)?\\.total_hits"
    match_type: regex
    name: "ratelimit_service_rate_limit_total_hits"
    labels:
      domain: "$1"
      key1: "$2"
      key2: "$3"
  - match: "ratelimit_server.*.response_time"
    name: "ratelimit_service_response_time_seconds"
    timer_type: histogram
    histogram_options:
      buckets: [0.001, 0.01]
    scale: 0.001
    labels:
      grpc_method: "$1"
  - match: "ratelimit_server.*.queue_time"
    name: "queue_time"
    timer_type: summary
  - match: "ratelimit.service.config_load_success"
    action: drop
    name: "dropped"
`

// series flattens gathered families whose name starts with prefix into
// lines: name{label="value",...} value, sorted. Histograms give their
// count, sum and buckets; summaries their count and sum.
func series(t *testing.T, fams []*dto.MetricFamily, prefix string) []string {
	t.Helper()
	var out []string
	for _, f := range fams {
		if !strings.HasPrefix(f.GetName(), prefix) {
			continue
		}
		for _, m := range f.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			name := f.GetName() + "{" + strings.Join(ls, ",") + "}"
			switch {
			case m.Counter != nil:
				out = append(out, fmt.Sprintf("%s %g", name, m.GetCounter().GetValue()))
			case m.Histogram != nil:
				h := m.GetHistogram()
				out = append(out, fmt.Sprintf("%s count=%d sum=%g", name, h.GetSampleCount(), h.GetSampleSum()))
				for _, b := range h.GetBucket() {
					out = append(out, fmt.Sprintf("%s le=%g %d", name, b.GetUpperBound(), b.GetCumulativeCount()))
				}
			case m.Summary != nil:
				out = append(out, fmt.Sprintf("%s count=%d sum=%g", name, m.GetSummary().GetSampleCount(), m.GetSummary().GetSampleSum()))
			default:
				out = append(out, name+" ?")
			}
		}
	}
	sort.Strings(out)
	return out
}

func newSink(t *testing.T, yaml string) *Sink {
	t.Helper()
	s, err := New(yaml, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestMapping: counters and timers become the series the mapping says
// (labels from globs and regular expressions, histogram buckets, scale,
// summaries, drop); an unmapped stat keeps statsd_exporter's name for it.
func TestMapping(t *testing.T) {
	s := newSink(t, mapping)
	s.Count("ratelimit.service.rate_limit.d.k.total_hits", 2)
	s.Count("ratelimit.service.rate_limit.d.k.total_hits", 1)
	s.Count("ratelimit.service.rate_limit.d.k_v.k2_v2.k3.total_hits", 5)
	s.Timing("ratelimit_server.ShouldRateLimit.response_time", 500*time.Microsecond)
	s.Timing("ratelimit_server.ShouldRateLimit.response_time", 3*time.Millisecond)
	s.Timing("ratelimit_server.ShouldRateLimit.queue_time", 2*time.Millisecond)
	s.Count("ratelimit.service.config_load_success", 1)
	s.Count("ratelimit.service.global_shadow_mode", 4)
	fams, err := s.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`queue_time{} count=1 sum=2`, // milliseconds: no scale
		`ratelimit_service_global_shadow_mode{} 4`,
		`ratelimit_service_rate_limit_total_hits{domain="d",key1="k"} 3`,
		`ratelimit_service_rate_limit_total_hits{domain="d",key1="k_v",key2="k2_v2"} 5`,
		`ratelimit_service_response_time_seconds{grpc_method="ShouldRateLimit"} count=2 sum=0.0035`,
		`ratelimit_service_response_time_seconds{grpc_method="ShouldRateLimit"} le=0.001 1`,
		`ratelimit_service_response_time_seconds{grpc_method="ShouldRateLimit"} le=0.01 2`,
	}
	got := append(series(t, fams, "queue_"), series(t, fams, "ratelimit_")...)
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("series (-want +got):\n%s", d)
	}
	if acts := series(t, fams, "statsd_exporter_events_actions_total"); !slices.Contains(acts, `statsd_exporter_events_actions_total{action="drop"} 1`) {
		t.Errorf("the dropped stat is not counted: %v", acts)
	}
}

// TestEveryStatBeforeAScrape: a scrape sees every stat counted before it,
// however many wait (more than maxPending are handed over as they come).
func TestEveryStatBeforeAScrape(t *testing.T) {
	s := newSink(t, mapping)
	const n = maxPending + 100
	for i := range n {
		s.Count(fmt.Sprintf("ratelimit.service.rate_limit.d.k%d.total_hits", i), 1)
	}
	for round := 1; round <= 3; round++ {
		s.Count("ratelimit.service.rate_limit.d.k0.total_hits", 1)
		fams, err := s.Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := series(t, fams, "ratelimit_service_rate_limit_total_hits")
		if len(got) != n {
			t.Fatalf("round %d: %d series, want %d", round, len(got), n)
		}
		if want := fmt.Sprintf(`ratelimit_service_rate_limit_total_hits{domain="d",key1="k0"} %d`, round+1); !slices.Contains(got, want) {
			t.Errorf("round %d: no %s", round, want)
		}
	}
}

// TestBadMapping: a mapping statsd_exporter refuses, or a file that cannot
// be read, is an error naming the file. (Keys it does not know are ignored,
// there as here: the mapping files of envoyproxy/ratelimit and Envoy Gateway
// use the deprecated timer_type, which the releases that refuse unknown keys
// no longer read.)
func TestBadMapping(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ name, yaml, want string }{
		{"bad_glob.yaml", "mappings:\n  - match: a.b_*\n    name: x\n", "invalid match"},
		{"bad_type.yaml", "mappings:\n  - match: a.b\n    name: x\n    timer_type: bucket\n", "bucket"},
		{"bad_regex.yaml", "mappings:\n  - match: \"a(\"\n    match_type: regex\n    name: x\n", "invalid regex"},
		{"no_name.yaml", "mappings:\n  - match: a.b\n", "metric name"},
		{"bad_label.yaml", "mappings:\n  - match: a.*\n    name: x\n    labels:\n      \"1x\": $1\n", "label"},
		{"not_yaml.yaml", "mappings: [", "yaml"},
	} {
		file := filepath.Join(dir, tc.name)
		if err := os.WriteFile(file, []byte(tc.yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := Open(file, nil)
		if err == nil {
			s.Close()
			t.Errorf("%s: accepted", tc.name)
			continue
		}
		if !strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming the file and %q", tc.name, err, tc.want)
		}
	}
	missing := filepath.Join(dir, "missing.yaml")
	if _, err := Open(missing, nil); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("a missing file: %v, want an error naming it", err)
	}
}

// TestClosed: stats after Close are dropped, and a scrape still answers.
func TestClosed(t *testing.T) {
	s, err := New(mapping, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Count("ratelimit.service.rate_limit.d.k.total_hits", 1)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s.Count("ratelimit.service.rate_limit.d.k.total_hits", 1)
	s.Timing("ratelimit_server.ShouldRateLimit.response_time", time.Millisecond)
	if _, err := s.Gather(); err != nil {
		t.Errorf("Gather after Close: %v", err)
	}
}

// TestBacktrackingSaidOnce: Envoy Gateway's own mapping makes
// statsd_exporter's mapper warn "backtracking required" once per
// overlapping glob rule, seven lines on every start that read as a fault;
// New says instead, once and at INFO, what they mean (nothing to do), with
// the rules. Its other warnings still pass as they are.
func TestBacktrackingSaidOnce(t *testing.T) {
	b, err := os.ReadFile("../../service/rls/testdata/envoygateway/statsd_conf.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, yaml string
		want       []string // level and message of each record, in order
		rules      int
	}{
		{"Envoy Gateway's mapping", string(b), []string{"INFO metrics mapping: some glob rules overlap others"}, 7},
		{"a rule that hides another", "mappings:\n  - match: \"a.*\"\n    name: x\n  - match: \"a.b\"\n    name: y\n",
			[]string{"WARN match is a super set of match but in a lower order"}, 0},
	} {
		var buf strings.Builder
		s, err := New(tc.yaml, slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})))
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		var got []string
		rules := 0
		for line := range strings.Lines(buf.String()) {
			var r struct {
				Level, Msg string
				Rules      []string
			}
			if err := json.Unmarshal([]byte(line), &r); err != nil {
				t.Fatalf("%s: %q: %v", tc.name, line, err)
			}
			got = append(got, r.Level+" "+r.Msg)
			rules += len(r.Rules)
		}
		if len(got) != len(tc.want) {
			t.Errorf("%s: logged %q, want %q", tc.name, got, tc.want)
			continue
		}
		for i := range got {
			if !strings.HasPrefix(got[i], tc.want[i]) {
				t.Errorf("%s: record %d is %q, want %q", tc.name, i, got[i], tc.want[i])
			}
		}
		if rules != tc.rules {
			t.Errorf("%s: %d rules named, want %d", tc.name, rules, tc.rules)
		}
	}
}
