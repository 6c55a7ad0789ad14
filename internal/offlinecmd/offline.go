// Package offlinecmd holds the verbs of the charon command that need no
// server: config check and config diff, suggest, replay (rollout.go), sim
// and escrow-sim (escrowsim.go). The verbs that load a configuration load it exactly as charon serve
// would: the settings that change how it loads start from serve's
// environment (LoadFlags), and their flags override it as serve's do.
package offlinecmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/internal/clientcmd"
	"github.com/charonlimit/charon/internal/sim"
	"github.com/charonlimit/charon/internal/suggest"
)

// LoadFlags declares on fs the flags that change how a configuration loads
// (config.Options.Bind), with the values charon serve takes from its
// environment (CHARON_*, envoyproxy/ratelimit's variables) as defaults, and
// returns the options they set once fs is parsed. Its error is a variable
// serve would refuse (wrapping clientcmd.ErrUsage). cmd/charon makes it
// from serve's own flag set, so that both read the environment alike.
type LoadFlags func(fs *flag.FlagSet, stderr io.Writer) (*config.Options, error)

// Verbs are the offline verbs by name, but config's (Config).
var Verbs = map[string]func(args []string, load LoadFlags, stdout, stderr io.Writer) error{
	"replay": Replay, "suggest": Suggest,
	"escrow-sim": func(args []string, _ LoadFlags, stdout, stderr io.Writer) error {
		return EscrowSim(args, stdout, stderr)
	},
	"sim": func(args []string, _ LoadFlags, stdout, stderr io.Writer) error { return Sim(args, stdout, stderr) },
}

// Config is `charon config check|diff ARGS`; it returns the exit status.
func Config(args []string, load LoadFlags, stdout, stderr io.Writer) int {
	switch {
	case len(args) >= 1 && args[0] == "check":
		return clientcmd.ExitCode(Check(args[1:], load, stdout, stderr), stderr)
	case len(args) >= 1 && args[0] == "diff":
		return DiffExitCode(Diff(args[1:], load, stdout, stderr), stderr)
	}
	fmt.Fprintln(stderr, "usage: charon config check DIR [--dump] [--merge-domains] [--fixed-window]\n       charon config diff OLD NEW [--json]")
	return 2
}

// Check is `charon config check`: it validates a configuration directory
// offline, exactly as serve would load it: the environment serve reads
// (MERGE_DOMAIN_CONFIG, CHARON_MERGE_DOMAINS, CHARON_FIXED_WINDOW...)
// applies here too, read by the same code, and a variable serve would
// refuse is refused here too; the flags override it, as serve's do. Flags
// may come before or after DIR. The verdict OK and warnings go to stdout
// (to stderr with --dump, whose YAML is stdout), errors and their count
// to stderr.
func Check(args []string, load LoadFlags, stdout, stderr io.Writer) error {
	fs := clientcmd.FlagSet("config check", stderr)
	dump := fs.Bool("dump", false, "print the resolved configuration as YAML")
	lo, err := load(fs, stderr)
	if err != nil {
		return err
	}
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: charon config check DIR [--dump] [--merge-domains] [--fixed-window] [--overdraft]")
		fs.PrintDefaults()
	}
	var dirs []string
	for {
		if err := fs.Parse(args); err != nil {
			if err == flag.ErrHelp {
				return err
			}
			return fmt.Errorf("%w: %v", clientcmd.ErrUsage, err)
		}
		if fs.NArg() == 0 {
			break
		}
		dirs = append(dirs, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(dirs) != 1 {
		return fmt.Errorf("%w: config check takes one directory", clientcmd.ErrUsage)
	}
	dir := dirs[0]
	if err := readableDir(dir); err != nil {
		return err
	}
	// The verdict and warnings are the output, unless --dump makes stdout
	// the YAML of the configuration.
	verdict := stdout
	if *dump {
		verdict = stderr
	}
	cfg, warns, err := config.Load(config.DirFS(dir), *lo)
	for _, w := range warns {
		fmt.Fprintln(verdict, "warning:", w.String())
	}
	if err != nil {
		errs := config.Problems(err)
		for _, e := range errs {
			fmt.Fprintln(stderr, "error:", e)
		}
		fmt.Fprintf(stderr, "%s: %d error(s), %d warning(s)\n", dir, len(errs), len(warns))
		return clientcmd.ErrReported
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
	fmt.Fprintf(verdict, "%s: OK, %d warning(s)\n", dir, len(warns))
	return nil
}

// Suggest is `charon suggest`: it reads a decision log and proposes
// limits as configuration files: with --config, that configuration with
// the proposed limits written in; without, new files.
func Suggest(args []string, load LoadFlags, stdout, stderr io.Writer) error {
	fs := clientcmd.FlagSet("suggest", stderr)
	logPath := fs.String("log", "-", "decision log `file` (JSON lines of charon serve --decision-log); - reads stdin")
	reject := fs.Float64("reject", 0.01, "share of the recorded hits the proposed limit may reject, in [0, 1)")
	window := fs.Duration("window", time.Second, "window of a proposed limit where no rule gives one (no --config, or traffic that matched no rule)")
	cfgDir := fs.String("config", "", "the configuration `directory` the log was recorded under: its rules keep their windows and everything else, only limits change")
	out := fs.String("out", "", "write the files into this `directory` (created); default: print them")
	lo, err := load(fs, stderr)
	if err != nil {
		return err
	}
	if err := clientcmd.ParseFlags(fs, args); err != nil {
		return err
	}
	opts := suggest.Options{Reject: *reject, Window: *window}
	if *cfgDir != "" {
		if opts.Config, err = loadDir(*cfgDir, *lo, stderr); err != nil {
			return err
		}
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
	ps, err := suggest.Suggest(in, opts)
	if err != nil {
		return fmt.Errorf("%s: %w", *logPath, err)
	}
	var files map[string][]byte
	if opts.Config != nil {
		var unplaced []suggest.Proposal
		files, unplaced, err = suggest.Edit(config.DirFS(*cfgDir), opts.Config, ps)
		for i := range unplaced {
			fmt.Fprintf(stderr, "no rule in %s for %s: %s\n", *cfgDir, unplaced[i].RLSDomain, suggest.Figures(&unplaced[i]))
		}
	} else {
		files, err = suggest.Files(ps)
	}
	if err != nil {
		return err
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if *out == "" {
			fmt.Fprintf(stdout, "# file: %s\n%s\n", name, files[name])
			continue
		}
		path := filepath.Join(*out, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, files[name], 0o644); err != nil {
			return err
		}
		fmt.Fprintln(stdout, path)
	}
	return nil
}

// Sim is `charon sim`: it serves the tier simulator on its own, or
// writes its files.
func Sim(args []string, stdout, stderr io.Writer) error {
	fs := clientcmd.FlagSet("sim", stderr)
	addr := fs.String("addr", "127.0.0.1:8090", "serve the simulator at `HOST:PORT`")
	out := fs.String("out", "", "write the page's files into this `directory` instead of serving them")
	if err := clientcmd.ParseFlags(fs, args); err != nil {
		return err
	}
	if *out != "" {
		if err := sim.WriteFiles(*out); err != nil {
			return err
		}
		fmt.Fprintln(stdout, *out)
		return nil
	}
	if !sim.Built() {
		fmt.Fprintln(stderr, "charon: this binary was built without the simulator's engine (make sim-wasm before building): the page will say so")
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "the tier simulator: http://%s/\n", ln.Addr())
	srv := &http.Server{Handler: sim.Handler(), ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
