// Package collect turns a store's Stats into Prometheus gauges and counters
// read at scrape time, so that each store exports its own collector.
package collect

import "github.com/prometheus/client_golang/prometheus"

// Metric is a gauge or counter read from a store's stats S at scrape time.
type Metric[S any] struct {
	Name, Help string
	Counter    bool
	Value      func(S) float64
}

// Collector returns the collector of ms, named namespace_subsystem_name,
// each reading stats (which must be safe for concurrent use) when scraped.
func Collector[S any](namespace, subsystem string, stats func() S, ms ...Metric[S]) prometheus.Collector {
	c := &collector{}
	for _, m := range ms {
		f := func() float64 { return m.Value(stats()) }
		if m.Counter {
			c.cs = append(c.cs, prometheus.NewCounterFunc(prometheus.CounterOpts{
				Namespace: namespace, Subsystem: subsystem, Name: m.Name, Help: m.Help}, f))
		} else {
			c.cs = append(c.cs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Namespace: namespace, Subsystem: subsystem, Name: m.Name, Help: m.Help}, f))
		}
	}
	return c
}

// collector is several collectors registered as one.
type collector struct{ cs []prometheus.Collector }

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, x := range c.cs {
		x.Describe(ch)
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	for _, x := range c.cs {
		x.Collect(ch)
	}
}
