package decisionlog

import (
	"flag"
	"fmt"
)

// Flags are the decision log's settings as command-line flags of charon
// serve: an empty Target logs nothing. Start from DefaultFlags.
type Flags struct {
	Target string
	Sample float64
	Rate   int
	All    bool
}

// DefaultFlags returns charon serve's defaults: no log; when one is
// asked for, 1% of ordinary grants and at most DefaultRate lines a second.
func DefaultFlags() Flags { return Flags{Sample: 0.01, Rate: DefaultRate} }

// Bind declares the flags on fs with f's values as defaults.
func (f *Flags) Bind(fs *flag.FlagSet) {
	fs.StringVar(&f.Target, "decision-log", f.Target, "write decisions as JSON lines to this `target`: a file, - (stdout) or unix:PATH (a socket)")
	fs.Float64Var(&f.Sample, "decision-log-sample", f.Sample, "share of ordinary grants logged; rejections and bursts are always logged")
	fs.IntVar(&f.Rate, "decision-log-rate", f.Rate, "most decision log lines per second, the rest dropped and counted; -1: no bound")
	fs.BoolVar(&f.All, "decision-log-all", f.All, "log every descriptor of every request, limited or not, for charon replay (the sample is then 1; set --decision-log-rate -1 too, or the rate bound drops lines)")
}

// Check refuses values that cannot work, naming the flag.
func (f *Flags) Check() error {
	if !(f.Sample >= 0 && f.Sample <= 1) {
		return fmt.Errorf("--decision-log-sample %v: want 0 to 1", f.Sample)
	}
	return nil
}

// Open opens the log Target names, or returns nil when it names none.
func (f *Flags) Open() (*Logger, error) {
	if f.Target == "" {
		return nil, nil
	}
	l, err := Open(f.Target, Options{Sample: f.Sample, Rate: f.Rate, All: f.All})
	if err != nil {
		return nil, fmt.Errorf("--decision-log: %w", err)
	}
	return l, nil
}
