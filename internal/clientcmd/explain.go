package clientcmd

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
)

// Explain is `charon explain`: why a request would be limited, from the
// server's Explain call, without changing any state; with --candidate, the
// same under the server's candidate configuration (--candidate-config)
// too, so both decisions show side by side.
func Explain(args []string, stdout, stderr io.Writer) error {
	var q queryFlags
	fs := q.declare("explain", "ExplainResponse", stderr)
	candidate := fs.Bool("candidate", false, "also explain under the server's candidate configuration (serve --candidate-config), against its own state")
	if err := q.parse(fs, "explain", args); err != nil {
		return err
	}
	req := &charonv1.ExplainRequest{Domain: q.domain}
	for _, es := range q.descriptors {
		req.Descriptors = append(req.Descriptors, &charonv1.ExplainRequest_Descriptor{Entries: es})
	}
	sides := []bool{false}
	if *candidate {
		sides = append(sides, true)
	}
	for _, cand := range sides {
		resp, err := rpc(&q.connFlags, func(ctx context.Context, cc *grpc.ClientConn) (*charonv1.ExplainResponse, error) {
			if cand {
				ctx = metadata.AppendToOutgoingContext(ctx, charonv1.CandidateHeader, "1")
			}
			return charonv1.NewCharonClient(cc).Explain(ctx, req)
		})
		if err != nil {
			return err
		}
		err = q.print(stdout, resp, func() {
			switch {
			case cand:
				fmt.Fprintln(stdout, "\nunder the candidate configuration:")
			case *candidate:
				fmt.Fprintln(stdout, "under the live configuration:")
			}
			for i, x := range resp.GetExplanations() {
				var es []string
				for _, e := range q.descriptors[i] {
					es = append(es, e.GetKey()+"="+e.GetValue())
				}
				printExplanation(stdout, strings.Join(es, ","), x, resp.GetAt().AsTime())
			}
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func printExplanation(w io.Writer, desc string, x *charonv1.Explanation, at time.Time) {
	fmt.Fprintf(w, "%s\n", desc)
	if x.GetLeaf() != "" {
		fmt.Fprintf(w, "  leaf      %s %s\n", x.GetLeaf(), x.GetName())
	}
	if !x.GetLimited() {
		fmt.Fprintf(w, "  not limited: %s\n", x.GetReason())
		return
	}
	fmt.Fprintf(w, "  resource  %s\n  domain    %s\n", x.GetTarget().GetResource(), x.GetTarget().GetDomain())
	policy := x.GetKind()
	if x.GetOverride() != "" {
		policy += " (" + x.GetOverride() + " override)"
	}
	for _, m := range []struct {
		on   bool
		name string
	}{{x.GetShadow(), "shadow"}, {x.GetQuota(), "quota mode"}} {
		if m.on {
			policy += ", " + m.name
		}
	}
	fmt.Fprintf(w, "  policy    %s\n", policy)
	if len(x.GetTiers()) > 0 {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  tier\tlimit\tactive\tcooldown\tphase\thits\tuntil")
		for i, t := range x.GetTiers() {
			active := "unbounded"
			if t.GetActive() != nil {
				active = t.GetActive().AsDuration().String()
			}
			until := "-"
			switch t.GetPhase() {
			case "active":
				if t.GetActiveUntil() != nil {
					until = t.GetActiveUntil().AsTime().Sub(at).Round(time.Millisecond).String()
				}
			case "cooldown":
				until = t.GetCooldownUntil().AsTime().Sub(at).Round(time.Millisecond).String()
			}
			cur := " "
			if int32(i+1) == x.GetTier() {
				cur = "*"
			}
			fmt.Fprintf(tw, "  %s%d\t%d per %s\t%s\t%s\t%s\t%d\t%s\n", cur, i+1, t.GetLimit(), t.GetWindow().AsDuration(),
				active, t.GetCooldown().AsDuration(), t.GetPhase(), t.GetHits(), until)
		}
		tw.Flush()
	}
	var limits []string
	if h := x.GetHardLimit(); h > 0 {
		limits = append(limits, fmt.Sprintf("hard %d/s (%d used)", h, x.GetDomainHits()))
	}
	if g := x.GetGlobalLimit(); g > 0 {
		limits = append(limits, fmt.Sprintf("global %d/s (%d used)", g, x.GetResourceHits()))
	}
	if len(limits) > 0 {
		fmt.Fprintf(w, "  limits    %s\n", strings.Join(limits, ", "))
	}
	if h := x.GetEscrow(); h != nil {
		fmt.Fprintf(w, "  escrow    in escrow on this replica: %s\n", escrowText(h, at))
	}
	fmt.Fprintf(w, "  now       %s\n", x.GetSummary())
}
