package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
)

// descriptorFlags collects repeated --descriptor k=v,k2=v2 values.
type descriptorFlags []*ratelimitv3.RateLimitDescriptor

func (d *descriptorFlags) String() string { return "" }

func (d *descriptorFlags) Set(s string) error {
	desc, err := parseDescriptor(s)
	if err != nil {
		return err
	}
	*d = append(*d, desc)
	return nil
}

// parseDescriptor parses "k=v,k2=v2"; a value may contain "=", not ",".
func parseDescriptor(s string) (*ratelimitv3.RateLimitDescriptor, error) {
	d := &ratelimitv3.RateLimitDescriptor{}
	for _, part := range strings.Split(s, ",") {
		k, v, _ := strings.Cut(part, "=")
		if k == "" {
			return nil, fmt.Errorf("entry %q has no key (want k=v,k2=v2)", part)
		}
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	return d, nil
}

func runAsk(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("charon ask", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cf connFlags
	cf.declare(fs, "localhost:8081", 5*time.Second)
	domain := fs.String("domain", "", "RLS domain")
	var descs descriptorFlags
	fs.Var(&descs, "descriptor", "descriptor `k=v,k2=v2` (repeatable)")
	hits := fs.Uint("hits", 0, "hits_addend of the request (0: one hit)")
	asJSON := fs.Bool("json", false, "print the RateLimitResponse as JSON")
	if err := parseVerb(fs, args); err != nil {
		return err
	}
	if *domain == "" || len(descs) == 0 {
		return fmt.Errorf("%w: ask needs --domain and at least one --descriptor", errUsage)
	}
	if *hits > 1<<32-1 {
		return fmt.Errorf("%w: --hits is at most %d", errUsage, uint32(1<<32-1))
	}
	req := &rlsv3.RateLimitRequest{Domain: *domain, Descriptors: descs, HitsAddend: uint32(*hits)}
	var resp *rlsv3.RateLimitResponse
	err := cf.call(func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, req)
		return err
	})
	if err != nil {
		s := status.Convert(err)
		return fmt.Errorf("%s: %s", s.Code(), s.Message())
	}
	if *asJSON {
		out, err := protojson.MarshalOptions{Multiline: true, EmitUnpopulated: true}.Marshal(resp)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, string(out))
		return nil
	}
	printDecision(stdout, req, resp)
	return nil
}

func printDecision(w io.Writer, req *rlsv3.RateLimitRequest, resp *rlsv3.RateLimitResponse) {
	fmt.Fprintf(w, "%s  domain %s\n", resp.GetOverallCode(), req.GetDomain())
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for i, st := range resp.GetStatuses() {
		var entries []string
		if i < len(req.Descriptors) {
			for _, e := range req.Descriptors[i].GetEntries() {
				entries = append(entries, e.GetKey()+"="+e.GetValue())
			}
		}
		limit := "no limit"
		if l := st.GetCurrentLimit(); l != nil {
			unit := strings.ToLower(l.GetUnit().String())
			if m := l.GetUnitMultiplier().GetValue(); m > 1 {
				unit = fmt.Sprintf("%d %ss", m, unit)
			}
			limit = fmt.Sprintf("%d per %s", l.GetRequestsPerUnit(), unit)
			if l.GetName() != "" {
				limit += " (" + l.GetName() + ")"
			}
		}
		fmt.Fprintf(tw, "  [%d] %s\t%s\t%s\tremaining %d\treset in %s\n", i, strings.Join(entries, ","),
			st.GetCode(), limit, st.GetLimitRemaining(), st.GetDurationUntilReset().AsDuration())
	}
	tw.Flush()
	for _, h := range resp.GetResponseHeadersToAdd() {
		fmt.Fprintf(w, "  header %s: %s\n", h.GetKey(), h.GetValue())
	}
}
