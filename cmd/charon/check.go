package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/charonlimit/charon/config"
)

// runCheck validates a configuration directory offline, exactly as serve
// would load it. Flags may come before or after DIR.
func runCheck(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("charon config check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dump := fs.Bool("dump", false, "print the resolved configuration as YAML")
	merge := fs.Bool("merge-domains", false, "merge files that share a domain instead of refusing them")
	fixed := fs.Bool("fixed-window", false, "rate_limit without an algorithm uses the calendar-aligned fixed window")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: charon config check DIR [--dump] [--merge-domains] [--fixed-window]")
		fs.PrintDefaults()
	}
	var dirs []string
	for {
		if err := fs.Parse(args); err != nil {
			if err == flag.ErrHelp {
				return err
			}
			return fmt.Errorf("%w: %v", errUsage, err)
		}
		if fs.NArg() == 0 {
			break
		}
		dirs = append(dirs, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(dirs) != 1 {
		return fmt.Errorf("%w: config check takes one directory", errUsage)
	}
	dir := dirs[0]
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return fmt.Errorf("%s is not a readable directory", dir)
	}
	cfg, warns, err := config.Load(config.DirFS(dir), config.Options{MergeDomains: *merge, FixedWindowDefault: *fixed})
	for _, w := range warns {
		fmt.Fprintln(stdout, "warning:", w.String())
	}
	if err != nil {
		errs := config.Problems(err)
		for _, e := range errs {
			fmt.Fprintln(stderr, "error:", e)
		}
		fmt.Fprintf(stderr, "%s: %d error(s), %d warning(s)\n", dir, len(errs), len(warns))
		return errReported
	}
	if cfg == nil {
		return errors.New("config loader returned no configuration")
	}
	if *dump {
		out, err := cfg.Dump()
		if err != nil {
			return fmt.Errorf("dump: %w", err)
		}
		stdout.Write(out)
	}
	fmt.Fprintf(stderr, "%s: OK, %d warning(s)\n", dir, len(warns))
	return nil
}
