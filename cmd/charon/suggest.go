package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/charonlimit/charon/internal/clientcmd"
	"github.com/charonlimit/charon/internal/suggest"
)

// runSuggest reads a decision log and proposes limits as configuration
// files.
func runSuggest(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("charon suggest", flag.ContinueOnError)
	fs.SetOutput(stderr)
	logPath := fs.String("log", "-", "decision log `file` (JSON lines of charon serve --decision-log); - reads stdin")
	reject := fs.Float64("reject", 0.01, "share of the recorded hits the proposed limit may reject, in [0, 1)")
	window := fs.Duration("window", time.Second, "window of the proposed tier")
	out := fs.String("out", "", "write one file per RLS domain into this `directory` (created); default: print them")
	if err := clientcmd.ParseFlags(fs, args); err != nil {
		return err
	}
	var in io.Reader = os.Stdin
	if *logPath != "-" {
		f, err := os.Open(*logPath)
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	}
	ps, err := suggest.Suggest(in, suggest.Options{Reject: *reject, Window: *window})
	if err != nil {
		return fmt.Errorf("%s: %w", *logPath, err)
	}
	files, err := suggest.Files(ps)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	slices.Sort(names)
	if *out != "" {
		if err := os.MkdirAll(*out, 0o755); err != nil {
			return err
		}
	}
	for _, name := range names {
		if *out == "" {
			fmt.Fprintf(stdout, "# file: %s\n%s\n", name, files[name])
			continue
		}
		path := filepath.Join(*out, name)
		if err := os.WriteFile(path, files[name], 0o644); err != nil {
			return err
		}
		fmt.Fprintln(stdout, path)
	}
	return nil
}
