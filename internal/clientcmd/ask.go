package clientcmd

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"

	"github.com/charonlimit/charon/descriptors"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// queryFlags are the flags of ask and explain: the server, the domain and
// the descriptors of one request, and --json.
type queryFlags struct {
	connFlags
	domain      string
	descriptors [][]*charonv1.Entry
	json        bool
}

func (q *queryFlags) declare(verb, what string, stderr io.Writer) *flag.FlagSet {
	fs := q.verb(verb, stderr)
	fs.StringVar(&q.domain, "domain", "", "RLS domain")
	fs.Func("descriptor", "descriptor `k=v,k2=v2` (repeatable)", func(s string) error {
		es, err := descriptors.ParseDescriptor(s)
		q.descriptors = append(q.descriptors, protoEntries(es))
		return err
	})
	fs.BoolVar(&q.json, "json", false, "print the "+what+" as JSON")
	return fs
}

// protoEntries converts a descriptor's entries to the API's.
func protoEntries(es []descriptors.Entry) []*charonv1.Entry {
	out := make([]*charonv1.Entry, len(es))
	for i, e := range es {
		out[i] = &charonv1.Entry{Key: e.Key, Value: e.Value}
	}
	return out
}

func (q *queryFlags) parse(fs *flag.FlagSet, verb string, args []string) error {
	if err := ParseFlags(fs, args); err != nil {
		return err
	}
	if q.domain == "" || len(q.descriptors) == 0 {
		return fmt.Errorf("%w: %s needs --domain and at least one --descriptor", ErrUsage, verb)
	}
	return nil
}

// print writes resp as JSON with --json, else as text.
func (q *queryFlags) print(w io.Writer, resp proto.Message, text func()) error {
	if !q.json {
		text()
		return nil
	}
	// Protobuf JSON as the /json endpoint and grpcurl print it: a field at
	// its zero value (a limit_remaining of 0, an OK code) is left out.
	out, err := protojson.MarshalOptions{Multiline: true}.Marshal(resp)
	fmt.Fprintln(w, string(out))
	return err
}

// Ask is `charon ask`: one ShouldRateLimit call, its answer printed.
func Ask(args []string, stdout, stderr io.Writer) error {
	var q queryFlags
	fs := q.declare("ask", "RateLimitResponse", stderr)
	hits := fs.Uint("hits", 0, "hits_addend of the request (0: one hit)")
	exitCode := fs.Bool("exit-code", false, "exit 3 when the answer is OVER_LIMIT (else 0 for any answer)")
	if err := q.parse(fs, "ask", args); err != nil {
		return err
	}
	if *hits > 1<<32-1 {
		return fmt.Errorf("%w: --hits is at most %d", ErrUsage, uint32(1<<32-1))
	}
	req := &rlsv3.RateLimitRequest{Domain: q.domain, HitsAddend: uint32(*hits)}
	for _, es := range q.descriptors {
		d := &ratelimitv3.RateLimitDescriptor{}
		for _, e := range es {
			d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	resp, err := rpc(&q.connFlags, func(ctx context.Context, cc *grpc.ClientConn) (*rlsv3.RateLimitResponse, error) {
		return rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, req)
	})
	if err != nil {
		return err
	}
	if err := q.print(stdout, resp, func() { printDecision(stdout, req, resp) }); err != nil {
		return err
	}
	if *exitCode && resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
		return ErrOverLimit
	}
	return nil
}

// rpc makes one call f on a new connection, within --timeout; a failed
// call's error is its code and message.
func rpc[T any](c *connFlags, f func(context.Context, *grpc.ClientConn) (T, error)) (T, error) {
	var resp T
	err := c.call(func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		resp, err = f(ctx, cc)
		return err
	})
	if err != nil {
		s := status.Convert(err)
		return resp, fmt.Errorf("%s: %s", s.Code(), s.Message())
	}
	return resp, nil
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
			st.GetCode(), limit, st.GetLimitRemaining(), Round(st.GetDurationUntilReset().AsDuration()))
	}
	tw.Flush()
	for _, h := range resp.GetResponseHeadersToAdd() {
		fmt.Fprintf(w, "  header %s: %s\n", h.GetKey(), h.GetValue())
	}
}
