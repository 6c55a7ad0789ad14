package main

// The verbs that check a change of limits before it takes effect: config
// diff and replay.

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/internal/clientcmd"
)

// loadDir loads a configuration directory as serve would, printing its
// problems to stderr.
func loadDir(dir string, opts config.Options, stderr io.Writer) (*config.Config, error) {
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("%s is not a readable directory", dir)
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

// parseInterspersed parses fs over args, flags before, between or after
// the positional arguments, and returns those.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if err == flag.ErrHelp {
				return nil, err
			}
			return nil, fmt.Errorf("%w: %v", errUsage, err)
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// runDiff prints the semantic difference of two configuration directories.
func runDiff(args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	sc, _, err := serveEnv(getenv, stderr)
	if err != nil {
		return err
	}
	fs := clientcmd.FlagSet("config diff", stderr)
	asJSON := fs.Bool("json", false, "print the difference as JSON")
	loadFlags(fs, sc)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: charon config diff OLD NEW [--json] [--merge-domains] [--fixed-window]")
		fs.PrintDefaults()
	}
	dirs, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(dirs) != 2 {
		return fmt.Errorf("%w: config diff takes two directories, OLD and NEW", errUsage)
	}
	var cfgs [2]*config.Config
	for i, dir := range dirs {
		if cfgs[i], err = loadDir(dir, sc.loadOptions(), stderr); err != nil {
			return err
		}
	}
	d := config.Compare(cfgs[0], cfgs[1])
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(d)
	}
	writeDiff(stdout, d)
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
