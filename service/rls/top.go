package rls

import (
	"embed"
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/charonlimit/charon/internal/offenders"
	"github.com/charonlimit/charon/server"
)

// maxTopLabel bounds a value in charon_top_hits' value label: a longer one
// is its stand-in (offenders.StandIn).
const maxTopLabel = 32

// serveTop is GET /top?domain=D&rule=R&n=N on the debug port.
func (s *Service) serveTop(w http.ResponseWriter, r *http.Request) {
	t := s.top
	if t == nil {
		http.Error(w, "top offenders are not tracked (--top-k 0)", http.StatusNotFound)
		return
	}
	q := r.URL.Query()
	o := t.Options()
	n := o.K
	if v := q.Get("n"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			http.Error(w, "n: want a positive number", http.StatusBadRequest)
			return
		}
	}
	now := time.Now()
	ans := offenders.Answer{At: now.UTC(), EpochSeconds: int(o.Epoch / time.Second), K: o.K, Dropped: t.Dropped(),
		Rules: t.Views(now, q.Get("domain"), q.Get("rule"), n)}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(ans)
}

//go:embed ui
var uiFiles embed.FS

// uiHandler serves the live page's static files under /ui/, the embedded
// tree's own path.
func uiHandler() http.Handler { return http.FileServerFS(uiFiles) }

// topCollector exports the top values of every rule as charon_top_hits, a
// bounded series set: at most MaxRules × 2 outcomes × n series.
type topCollector struct {
	t       *offenders.Tracker
	n       int
	values  bool
	hits    *prometheus.Desc
	dropped *prometheus.Desc
}

func newTopCollector(t *offenders.Tracker, n int, values bool) *topCollector {
	labels := []string{"domain", "rule", "outcome", "rank"}
	if values {
		labels = append(labels, "value")
	}
	return &topCollector{t: t, n: n, values: values,
		hits: prometheus.NewDesc("charon_top_hits",
			"Estimated hits of the top values of each rule over the recent interval (one to two --top-epoch), by outcome (rejected, shadow included; granted) and rank; an estimate exceeds the true count by at most the rule's hits / --top-k.",
			labels, nil),
		dropped: prometheus.NewDesc("charon_top_dropped_total",
			"Descriptor decisions not tracked by the top offenders because --top-rules rules were tracked already.", nil, nil),
	}
}

func (c *topCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.hits
	ch <- c.dropped
}

func (c *topCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.CounterValue, float64(c.t.Dropped()))
	if c.n <= 0 {
		return
	}
	for _, v := range c.t.Views(time.Now(), "", "", c.n) {
		for _, o := range []struct {
			name string
			w    *offenders.Window
		}{{"rejected", &v.Rejected}, {"granted", &v.Granted}} {
			for i, it := range o.w.Items {
				labels := []string{server.ValidLabel(v.Domain), server.ValidLabel(v.Rule.Rule), o.name, strconv.Itoa(i + 1)}
				if c.values {
					labels = append(labels, server.ValidLabel(offenders.StandIn(it.Value, maxTopLabel)))
				}
				ch <- prometheus.MustNewConstMetric(c.hits, prometheus.GaugeValue, float64(it.Count), labels...)
			}
		}
	}
}
