package offlinecmd

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/signal"
	"syscall"

	"github.com/charonlimit/charon/internal/clientcmd"
	"github.com/charonlimit/charon/internal/escrowsim"
)

// EscrowSim is `charon escrow-sim`: replicas deciding one sliding-window
// rule from escrow leases, in regions, in this process and in real time
// (package escrowsim), with skewed and shifting demand, a replica killed
// and a region cut off; it prints a row per window (grants against the
// limit, false rejections, calls to the home per decision, shares,
// latency) and a summary, or all of it as JSON (--json). Interrupted, it
// reports the run so far.
func EscrowSim(args []string, stdout, stderr io.Writer) error {
	fs := clientcmd.FlagSet("escrow-sim", stderr)
	o := escrowsim.DefaultOptions()
	o.Bind(fs)
	asJSON := fs.Bool("json", false, "print the result as JSON")
	if err := clientcmd.ParseFlags(fs, args); err != nil {
		return err
	}
	o.Parsed(fs)
	if err := o.Check(); err != nil {
		return fmt.Errorf("%w: %v", clientcmd.ErrUsage, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if !*asJSON {
		fmt.Fprintf(stderr, "charon escrow-sim: running for %v\n", o.Duration)
	}
	res, err := escrowsim.Run(ctx, o)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	return escrowsim.Write(stdout, o, res)
}
