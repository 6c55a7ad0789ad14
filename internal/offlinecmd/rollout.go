package offlinecmd

// The verbs that check a change of limits before it takes effect: config
// diff and replay.

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/internal/clientcmd"
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/internal/replay"
)

// loadDir loads a configuration directory as serve would, printing its
// problems to stderr.
func loadDir(dir string, opts config.Options, stderr io.Writer) (*config.Config, error) {
	if err := readableDir(dir); err != nil {
		return nil, err
	}
	cfg, _, err := config.Load(config.DirFS(dir), opts)
	if err != nil {
		for _, e := range config.Problems(err) {
			fmt.Fprintln(stderr, "error:", e)
		}
		return nil, fmt.Errorf("%s: invalid configuration", dir)
	}
	return cfg, nil
}

// readableDir refuses, saying why, a configuration directory that is
// missing, unreadable or a file.
func readableDir(dir string) error {
	fi, err := os.Stat(dir)
	var pe *fs.PathError
	switch {
	case errors.As(err, &pe):
		return fmt.Errorf("%s is not a readable directory: %v", dir, pe.Err)
	case err != nil:
		return fmt.Errorf("%s is not a readable directory: %v", dir, err)
	case !fi.IsDir():
		return fmt.Errorf("%s is not a readable directory but a file: give the directory that holds the configuration files", dir)
	}
	return nil
}

// parseInterspersed parses fs over args, flags before, between or after
// the positional arguments, and returns those.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if err == flag.ErrHelp {
				return nil, err
			}
			return nil, fmt.Errorf("%w: %v", clientcmd.ErrUsage, err)
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// errDiffer is config diff's answer when the configurations differ,
// printed already.
var errDiffer = errors.New("the configurations differ")

// DiffExitCode is config diff's exit status for Diff's err, as diff(1)'s,
// so that a script can tell: 0 when the configurations are the same, 1
// when they differ, 2 on trouble (a usage mistake, a directory that does
// not load).
func DiffExitCode(err error, stderr io.Writer) int {
	switch {
	case errors.Is(err, errDiffer):
		return 1
	case clientcmd.ExitCode(err, stderr) == 0:
		return 0
	}
	return 2
}

// Diff is `charon config diff`: it prints the semantic difference of two
// configuration directories; errDiffer when there is one.
func Diff(args []string, load LoadFlags, stdout, stderr io.Writer) error {
	fs := clientcmd.FlagSet("config diff", stderr)
	asJSON := fs.Bool("json", false, "print the difference as JSON")
	lo, err := load(fs, stderr)
	if err != nil {
		return err
	}
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: charon config diff OLD NEW [--json] [--merge-domains] [--fixed-window]")
		fmt.Fprintln(stderr, "exit status, as diff(1)'s: 0 when the configurations are the same, 1 when they differ, 2 on trouble")
		fs.PrintDefaults()
	}
	dirs, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(dirs) != 2 {
		return fmt.Errorf("%w: config diff takes two directories, OLD and NEW", clientcmd.ErrUsage)
	}
	var cfgs [2]*config.Config
	for i, dir := range dirs {
		if cfgs[i], err = loadDir(dir, *lo, stderr); err != nil {
			return err
		}
	}
	d := config.Compare(cfgs[0], cfgs[1])
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(d); err != nil {
			return err
		}
	} else {
		writeDiff(stdout, d)
	}
	if !d.Empty() {
		return errDiffer
	}
	return nil
}

// writeDiff prints a Diff as a table: + added, - removed, ~ changed, and
// the descriptors whose rule changes.
func writeDiff(w io.Writer, d *config.Diff) {
	if d.Empty() {
		fmt.Fprintln(w, "no difference")
		return
	}
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	sign := map[string]string{config.Added: "+", config.Removed: "-", config.Changed: "~"}
	for _, c := range d.Domains {
		fmt.Fprintf(tw, "%s\tdomain %s\t", sign[c.Kind], c.Domain)
		for _, f := range c.Changes {
			fmt.Fprintf(tw, " %s: %s -> %s", f.Field, f.Old, f.New)
		}
		fmt.Fprintln(tw)
	}
	if len(d.Rules) > 0 {
		fmt.Fprintln(tw, "\trule\tlimit\tsource")
	}
	for _, r := range d.Rules {
		switch r.Kind {
		case config.Added:
			fmt.Fprintf(tw, "+\t%s: %s\t%s\t%s\n", r.Domain, r.Descriptor, r.NewLimit, r.NewSource)
		case config.Removed:
			fmt.Fprintf(tw, "-\t%s: %s\t%s\t%s\n", r.Domain, r.Descriptor, r.OldLimit, r.OldSource)
		default:
			var ch []string
			for _, f := range r.Changes {
				ch = append(ch, fmt.Sprintf("%s: %s -> %s", f.Field, f.Old, f.New))
			}
			fmt.Fprintf(tw, "~\t%s: %s\t%s\t%s\n", r.Domain, r.Descriptor, strings.Join(ch, "; "), r.NewSource)
		}
	}
	if len(d.Moved) > 0 {
		fmt.Fprintln(tw, "\tdescriptor\tmatched by (old -> new)\t")
	}
	for _, m := range d.Moved {
		fmt.Fprintf(tw, ">\t%s: %s\t%s -> %s\t\n", m.Domain, m.Descriptor, m.From, m.To)
	}
	tw.Flush()
}

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

// Replay is `charon replay`: it replays decision logs against a candidate
// configuration and reports what would change.
func Replay(args []string, load LoadFlags, stdout, stderr io.Writer) error {
	fs := clientcmd.FlagSet("replay", stderr)
	var logs listFlag
	fs.Var(&logs, "log", "decision log `file` to replay (repeatable; - reads stdin); record it with charon serve --decision-log-all")
	cfgDir := fs.String("config", "", "the candidate configuration `directory` (required)")
	against := fs.String("against", "", "the baseline configuration `directory`, replayed like the candidate; default: the answers the log recorded")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	topN := fs.Int("top", 10, "descriptors listed per rule and way in the table (--json lists all unless --top is given); 0 lists all")
	quota := fs.Bool("quota-mode", false, "decide as charon serve --quota-mode")
	lo, err := load(fs, stderr)
	if err != nil {
		return err
	}
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: charon replay --log FILE [--log FILE…] --config DIR [--against DIR] [--json] [--top N]")
		fs.PrintDefaults()
	}
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	logs = append(logs, pos...)
	if len(logs) == 0 || *cfgDir == "" {
		return fmt.Errorf("%w: replay needs --log FILE and --config DIR", clientcmd.ErrUsage)
	}
	if *asJSON && !isSet(fs, "top") {
		*topN = 0
	}
	opts := replay.Options{Top: *topN, Engine: engine.Options{QuotaMode: *quota, FixedWindowOverrides: lo.FixedWindowDefault, Overdraft: lo.OverdraftDefault}}
	if opts.Candidate, err = loadDir(*cfgDir, *lo, stderr); err != nil {
		return err
	}
	if *against != "" {
		if opts.Against, err = loadDir(*against, *lo, stderr); err != nil {
			return err
		}
	}
	var readers []io.Reader
	for _, name := range logs {
		if name == "-" {
			readers = append(readers, os.Stdin)
			continue
		}
		f, err := os.Open(name)
		if err != nil {
			return err
		}
		defer f.Close()
		readers = append(readers, bufio.NewReaderSize(f, 256<<10))
	}
	log, err := replay.Read(readers...)
	if err != nil {
		return err
	}
	rep, err := replay.Run(context.Background(), log, opts)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	writeReport(stdout, rep, *against)
	return nil
}

// writeReport prints a replay's report as a table, each rule followed by
// the descriptors whose answer changes.
func writeReport(w io.Writer, rep *replay.Report, against string) {
	l := rep.Log
	switch {
	case l.Complete:
		fmt.Fprintf(w, "log: %d lines, complete", l.Lines)
		if l.Missing > 0 {
			fmt.Fprintf(w, ", but %d requests were dropped by its rate bound or queue: the replay misses them", l.Missing)
		}
		fmt.Fprintln(w)
	case l.Sampled > 0:
		fmt.Fprintf(w, "log: %d lines, sampled (%d lines stand for more than one decision): the replay sees less traffic than there was and rejects less than the candidate would (record with --decision-log-all)\n", l.Lines, l.Sampled)
	default:
		fmt.Fprintf(w, "log: %d lines, not complete: descriptors no limit applied to were not logged, so the replay cannot see what a new rule would limit (record with --decision-log-all)\n", l.Lines)
	}
	if rep.Baseline == "against" {
		fmt.Fprintf(w, "baseline: %s, replayed\n", against)
	} else {
		fmt.Fprintln(w, "baseline: the answers the log recorded")
	}
	fmt.Fprintf(w, "requests: %d replayed (%d refused as invalid); %d newly rejected, %d newly granted\n\n", rep.Requests, rep.Invalid, rep.NewlyRejected, rep.NewlyGranted)
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "rule\tlimit (baseline -> candidate)\tgranted\trejected\tshadow\tnewly rejected\tnewly granted\tpeak")
	peak := func(p float64) string {
		if p < 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f", p)
	}
	lim := func(s string) string { return cmp.Or(s, "none") }
	for _, r := range rep.Rules {
		b, c := &r.Baseline, &r.Candidate
		fmt.Fprintf(tw, "%s: %s\t%s -> %s\t%d -> %d\t%d -> %d\t%d -> %d\t%d\t%d\t%s -> %s\n", r.Domain, r.Descriptor,
			lim(b.Limit), lim(c.Limit), b.Granted, c.Granted, b.Rejected, c.Rejected, b.Shadow, c.Shadow,
			r.NewlyRejected, r.NewlyGranted, peak(b.Peak), peak(c.Peak))
	}
	tw.Flush()
	for _, r := range rep.Rules {
		for _, way := range []struct {
			name string
			cs   []replay.Count
		}{{"newly rejected", r.TopNewlyRejected}, {"newly granted", r.TopNewlyGranted}, {"rejected under the candidate", r.Candidate.TopRejected}} {
			if len(way.cs) == 0 {
				continue
			}
			var parts []string
			for _, c := range way.cs {
				parts = append(parts, fmt.Sprintf("%s (%d)", c.Descriptor, c.Count))
			}
			fmt.Fprintf(w, "\n%s: %s, %s: %s", r.Domain, r.Descriptor, way.name, strings.Join(parts, ", "))
		}
	}
	fmt.Fprintln(w)
}

// isSet reports whether flag name was set on the command line.
func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
