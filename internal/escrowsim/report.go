package escrowsim

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Scenario says o in one line: the replicas and regions, the rule, the
// load, and the events.
func Scenario(o Options) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d replicas in %d region(s), %v round trip to the home", o.Replicas, o.Regions, o.Latency)
	if o.Pools {
		b.WriteString(", leases from regions' pools")
	}
	fmt.Fprintf(&b, "; limit %d per %v; offered %gx the limit (%.0f/s)", o.Limit, o.Window, o.Rate, o.Rate*float64(o.Limit)/o.Window.Seconds())
	if o.Skew > 1 && o.Replicas > 1 {
		fmt.Fprintf(&b, ", replica 0 at %gx each other's rate", o.Skew)
		if o.Shift > 0 {
			fmt.Fprintf(&b, ", replica 1 from %v", o.Shift)
		}
	}
	if o.Kill > 0 {
		fmt.Fprintf(&b, "; the heavy replica killed at %v", o.Kill)
	}
	if o.Cut > 0 {
		fmt.Fprintf(&b, "; region %d cut off from %v to %v", o.CutRegion, o.Cut, o.Cut+o.CutFor)
	}
	return b.String()
}

// Write prints res as a table, a row per window, then its summary.
func Write(w io.Writer, o Options, res *Result) error {
	fmt.Fprintf(w, "# %s\n", Scenario(o))
	fmt.Fprintf(w, "# per window of %v: requests granted, the most granted in any window of %v (limit %d), rejected, false rejections\n",
		o.Window, time.Duration(res.Measured*float64(time.Second)).Round(time.Microsecond), res.Limit)
	fmt.Fprintf(w, "# (rejected while the window before held fewer than %d grants), failed, decided from leases, calls to the home and to the\n", res.Limit-res.Margin)
	fmt.Fprintf(w, "# regions' leasers per decision, decision latency (ms); per replica: granted/fair share (-: none) at the window's end\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "end\tgranted\tmost\trejected\tfalse\tfailed\tlocal\thome/dec\tregion/dec\tp50\tp99\t")
	for i := range o.Replicas {
		fmt.Fprintf(tw, "r%d\t", i)
	}
	fmt.Fprintln(tw)
	for _, r := range res.Rows {
		fmt.Fprintf(tw, "%gs\t%d\t%d\t%d\t%d\t%d\t%.1f%%\t%.4f\t%.4f\t%.3f\t%.3f\t", r.End, r.Granted, r.MostGranted, r.Rejected, r.False, r.Failed,
			100*r.Local, r.HomeCalls, r.RegionCalls, r.P50, r.P99)
		for _, rr := range r.Replicas {
			switch {
			case rr.Killed:
				fmt.Fprintf(tw, "%d/killed\t", rr.Granted)
			case rr.Share < 0:
				fmt.Fprintf(tw, "%d/-\t", rr.Granted)
			default:
				fmt.Fprintf(tw, "%d/%d\t", rr.Granted, rr.Share)
			}
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	s := res.Summary
	pct := func(a, b int64) float64 {
		if b == 0 {
			return 0
		}
		return 100 * float64(a) / float64(b)
	}
	fmt.Fprintf(w, "over %v: %s of %s requests granted, %.1f per window against the limit %d (%.1f%%)\n", o.Duration,
		group(s.Granted), group(s.Requests), s.GrantedPerWindow, res.Limit, 100*s.GrantedPerWindow/float64(res.Limit))
	fmt.Fprintf(w, "  most granted in any window of %v: %d; over-grants: %d\n",
		time.Duration(res.Measured*float64(time.Second)).Round(time.Microsecond), s.MostGranted, s.OverGrants)
	fmt.Fprintf(w, "  rejected %s; false rejections %s (%.2f%% of requests), %s under the limit by less than %d; failed %s (%.2f%%)\n",
		group(s.Rejected), group(s.False), 100*s.FalseShare, group(s.UnderLimit-s.False), res.Margin, group(s.Failed), pct(s.Failed, s.Requests))
	fmt.Fprintf(w, "  decided from leases %.1f%%; calls per decision: home %.4f, regions' leasers %.4f\n", 100*s.Local, s.HomeCalls, s.RegionCalls)
	fmt.Fprintf(w, "  decision latency: p50 %.3f ms, p99 %.3f ms\n", s.P50, s.P99)
	fmt.Fprintf(w, "  leases taken %s, hits given back %s, leases expired %s, refused %s",
		group(int64(s.Leases)), group(int64(s.GivenBack)), group(int64(s.Expired)), group(int64(s.Refused)))
	if o.Pools {
		fmt.Fprintf(w, "\n  regions: slices taken from the home %s, of %s hits; refused %s; given back at once (short) %s; calls to the home for slices %s; leases asked for with no slice open %s",
			group(int64(s.Slices)), group(int64(s.SliceHits)), group(int64(s.SlicesRefused)), group(int64(s.Short)), group(int64(s.SliceCalls)), group(int64(s.Misses)))
	}
	fmt.Fprintln(w)
	return nil
}

// group writes n with thousands separated by commas.
func group(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
