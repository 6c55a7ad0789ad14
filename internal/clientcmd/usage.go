package clientcmd

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
)

// Usage is `charon usage`: how much of each matched limit (rate policy,
// calendar quota) the descriptors have used and when it renews, from the
// server's Usage call, without counting anything.
func Usage(args []string, stdout, stderr io.Writer) error {
	var q queryFlags
	fs := q.declare("usage", "UsageResponse", stderr)
	if err := q.parse(fs, "usage", args); err != nil {
		return err
	}
	req := &charonv1.UsageRequest{Domain: q.domain}
	for _, es := range q.descriptors {
		req.Descriptors = append(req.Descriptors, &charonv1.ExplainRequest_Descriptor{Entries: es})
	}
	resp, err := rpc(&q.connFlags, func(ctx context.Context, cc *grpc.ClientConn) (*charonv1.UsageResponse, error) {
		return charonv1.NewCharonClient(cc).Usage(ctx, req)
	})
	if err != nil {
		return err
	}
	return q.print(stdout, resp, func() { printUsage(stdout, q.descriptors, resp) })
}

// printUsage writes one line per limit, under the descriptor it belongs to,
// with what this replica's escrow leases hold of it when it is leased.
func printUsage(w io.Writer, descs [][]*charonv1.Entry, resp *charonv1.UsageResponse) {
	if len(resp.GetLimits()) == 0 {
		fmt.Fprintln(w, "no limit applies")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "descriptor\tkind\tperiod\tused\tlimit\tremaining\trenews\tcooldown\tescrow on this replica")
	at := resp.GetAt().AsTime()
	for _, l := range resp.GetLimits() {
		var es []string
		if i := int(l.GetDescriptorIndex()); i >= 0 && i < len(descs) {
			for _, e := range descs[i] {
				es = append(es, e.GetKey()+"="+e.GetValue())
			}
		}
		renews := "-"
		if r := l.GetRenews(); r != nil {
			renews = fmt.Sprintf("%s (in %s)", r.AsTime().UTC().Format("2006-01-02T15:04:05Z07:00"), Round(r.AsTime().Sub(at)))
		}
		cooldown := "-"
		if l.GetCooldown() {
			cooldown = "yes"
		}
		held := "-"
		if h := l.GetEscrow(); h != nil {
			held = escrowText(h, at)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\n", strings.Join(es, ","), l.GetKind(), l.GetPeriod(),
			l.GetUsed(), l.GetLimit(), l.GetRemaining(), renews, cooldown, held)
	}
	tw.Flush()
}

// escrowText says what a replica's escrow leases hold of a pair, as of at:
// the hits they may still grant, how many leases, granted from them, until
// when; the replica's demand and fair share per window (share "-": none
// yet, or leases sized by demand alone); its decisions per second.
func escrowText(h *charonv1.EscrowHolding, at time.Time) string {
	var b strings.Builder
	if h.GetLeases() == 0 {
		b.WriteString("no live lease")
	} else {
		leases := "leases"
		if h.GetLeases() == 1 {
			leases = "lease"
		}
		fmt.Fprintf(&b, "%d held in %d %s, %d granted", h.GetHeld(), h.GetLeases(), leases, h.GetGranted())
		if u := h.GetUntil(); u != nil {
			fmt.Fprintf(&b, ", until %s (in %s)", u.AsTime().UTC().Format(time.RFC3339Nano), Round(u.AsTime().Sub(at)))
		}
	}
	share := "-"
	if h.GetShare() >= 0 {
		share = fmt.Sprint(h.GetShare())
	}
	fmt.Fprintf(&b, "; demand %d, share %s per window; %.0f decisions/s", h.GetDemand(), share, h.GetRate())
	return b.String()
}
