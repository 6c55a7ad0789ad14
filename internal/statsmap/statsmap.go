package statsmap

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/statsd_exporter/pkg/event"
	"github.com/prometheus/statsd_exporter/pkg/exporter"
	"github.com/prometheus/statsd_exporter/pkg/mapper"
)

// maxPending bounds the stats (distinct counter names and timings) a Sink
// keeps between scrapes; reaching it hands them to the exporter at once.
const maxPending = 4096

// Sink receives statsd stats and serves the series its mapping makes of
// them (Gather). Safe for concurrent use. Use Open or New; the zero value is
// not usable. Close it to stop its exporter.
type Sink struct {
	reg    *prometheus.Registry
	events chan event.Events
	done   chan struct{}

	mu      sync.Mutex
	counts  map[string]float64
	timings []timing

	sendMu sync.Mutex // held while handing a batch over
	closed bool       // under sendMu
}

type timing struct {
	name string
	ms   float64
}

// Open reads the statsd_exporter mapping file and starts a Sink with it; an
// error names the file. logger receives the exporter's debug lines (nil:
// none).
func Open(file string, logger *slog.Logger) (*Sink, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	s, err := New(string(b), logger)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return s, nil
}

// New starts a Sink with the statsd_exporter mapping yaml (a file's
// contents).
func New(yaml string, logger *slog.Logger) (*Sink, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	var overlapping []string
	m := &mapper.MetricMapper{Logger: slog.New(&backtrackNotes{next: logger.Handler(), rules: &overlapping})}
	if err := m.InitFromYAMLString(yaml); err != nil {
		return nil, err
	}
	m.Logger = logger
	if len(overlapping) > 0 {
		logger.Info("metrics mapping: some glob rules overlap others, so statsd_exporter's mapper backtracks to match them "+
			"(its 'backtracking required' warning): some more work per stat mapped, on the exporter's goroutine, "+
			"never a different series; nothing to do", "rules", overlapping)
	}
	reg := prometheus.NewRegistry()
	// statsd_exporter's own accounting, under its names, as
	// envoyproxy/ratelimit serves it: unmapped, conflicting and dropped
	// events show here.
	eventsActions := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "statsd_exporter_events_actions_total", Help: "The total number of StatsD events by action.",
	}, []string{"action"})
	eventsUnmapped := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "statsd_exporter_events_unmapped_total", Help: "The total number of StatsD events no mapping was found for.",
	})
	metricsCount := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "statsd_exporter_metrics_total", Help: "The total number of metrics.",
	}, []string{"type"})
	conflicts := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "statsd_exporter_events_conflict_total", Help: "The total number of StatsD events with conflicting names.",
	}, []string{"type", "metric_name"})
	eventStats := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "statsd_exporter_events_total", Help: "The total number of StatsD events seen.",
	}, []string{"type"})
	errorStats := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "statsd_exporter_events_error_total", Help: "The total number of StatsD events discarded due to errors.",
	}, []string{"reason"})
	if err := registerAll(reg, eventsActions, eventsUnmapped, metricsCount, conflicts, eventStats, errorStats); err != nil {
		return nil, err
	}
	exp := exporter.NewExporter(reg, m, logger, eventsActions, eventsUnmapped, errorStats, eventStats, conflicts, metricsCount)
	s := &Sink{
		reg:    reg,
		events: make(chan event.Events),
		done:   make(chan struct{}),
		counts: make(map[string]float64),
	}
	go func() {
		defer close(s.done)
		exp.Listen(s.events)
	}()
	return s, nil
}

func registerAll(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// Count adds n to the statsd counter name.
func (s *Sink) Count(name string, n int64) {
	s.mu.Lock()
	s.counts[name] += float64(n)
	full := len(s.counts)+len(s.timings) >= maxPending
	s.mu.Unlock()
	if full {
		s.flush(false)
	}
}

// Timing records a statsd timer of name: d in milliseconds, as
// envoyproxy/ratelimit's timers are (there in whole milliseconds, here with
// their fraction), for the mapping to scale.
func (s *Sink) Timing(name string, d time.Duration) {
	s.mu.Lock()
	s.timings = append(s.timings, timing{name, float64(d) / float64(time.Millisecond)})
	full := len(s.counts)+len(s.timings) >= maxPending
	s.mu.Unlock()
	if full {
		s.flush(false)
	}
}

// Gather returns the mapped series, with every stat received before the
// call.
func (s *Sink) Gather() ([]*dto.MetricFamily, error) {
	s.flush(true)
	return s.reg.Gather()
}

// flush hands the pending stats to the exporter; wait: and returns once it
// has handled them.
func (s *Sink) flush(wait bool) {
	s.mu.Lock()
	counts, timings := s.counts, s.timings
	if len(counts) > 0 {
		s.counts = make(map[string]float64, len(counts))
	}
	s.timings = nil
	s.mu.Unlock()
	batch := make(event.Events, 0, len(counts)+len(timings))
	for name, v := range counts {
		// The exporter adds the mapping's labels to the event's map.
		batch = append(batch, &event.CounterEvent{CMetricName: name, CValue: v, CLabels: map[string]string{}})
	}
	for _, t := range timings {
		batch = append(batch, &event.ObserverEvent{OMetricName: t.name, OValue: t.ms, OLabels: map[string]string{}})
	}
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	if s.closed {
		return
	}
	if len(batch) > 0 {
		s.events <- batch
	}
	if wait {
		// The exporter takes the next batch only once it has handled the
		// last: an empty one is the sign that all before it are done.
		s.events <- nil
	}
}

// Close stops the exporter; stats received after it are dropped.
func (s *Sink) Close() error {
	s.sendMu.Lock()
	if !s.closed {
		s.closed = true
		close(s.events)
	}
	s.sendMu.Unlock()
	<-s.done
	return nil
}

// backtrackMessage starts the warning statsd_exporter's mapper logs once
// per glob rule that another rule of its length overlaps.
const backtrackMessage = "backtracking required"

// backtrackNotes is the mapper's log handler while it loads a mapping: it
// keeps the rules of its backtracking warnings, which a sound mapping such
// as Envoy Gateway's own raises on every start (seven lines that read as a
// fault), for New to say once what they mean; every other record goes on
// to next.
type backtrackNotes struct {
	next  slog.Handler
	rules *[]string
}

func (h *backtrackNotes) Enabled(ctx context.Context, l slog.Level) bool {
	return l == slog.LevelWarn || h.next.Enabled(ctx, l)
}

func (h *backtrackNotes) Handle(ctx context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, backtrackMessage) {
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "match" {
				*h.rules = append(*h.rules, a.Value.String())
			}
			return true
		})
		return nil
	}
	if !h.next.Enabled(ctx, r.Level) {
		return nil
	}
	return h.next.Handle(ctx, r)
}

func (h *backtrackNotes) WithAttrs(as []slog.Attr) slog.Handler {
	return &backtrackNotes{next: h.next.WithAttrs(as), rules: h.rules}
}

func (h *backtrackNotes) WithGroup(name string) slog.Handler {
	return &backtrackNotes{next: h.next.WithGroup(name), rules: h.rules}
}
