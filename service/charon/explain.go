package charon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/server"
	"github.com/charonlimit/charon/tiers"
)

// Explainer is what explain and reset need from the decision pipeline;
// *engine.Engine implements it.
type Explainer interface {
	Explain(ctx context.Context, req *engine.Request) ([]engine.Explanation, error)
	Reset(ctx context.Context, req *engine.Request) (int, error)
}

// errNoExplainer is the answer of a server whose engine cannot explain.
var errNoExplainer = status.Error(codes.Unimplemented, "the engine cannot explain")

// Explain implements charon.v1.Charon.
func (c *Service) Explain(ctx context.Context, req *charonv1.ExplainRequest) (*charonv1.ExplainResponse, error) {
	ex, ok := c.engine.(Explainer)
	if !ok {
		return nil, c.done("Explain", errNoExplainer)
	}
	if wantsCandidate(ctx) {
		var err error
		if ex, err = candidateExplainer(c.opts.Candidate); err != nil {
			return nil, c.done("Explain", err)
		}
	}
	resp, err := explain(ctx, ex, req)
	return resp, c.done("Explain", err)
}

// engineRequest converts an ExplainRequest to the engine's request.
func engineRequest(req *charonv1.ExplainRequest) *engine.Request {
	r := &engine.Request{Domain: req.GetDomain(), Descriptors: make([]engine.Descriptor, len(req.GetDescriptors()))}
	for i, d := range req.GetDescriptors() {
		es := make([]descriptors.Entry, len(d.GetEntries()))
		for j, e := range d.GetEntries() {
			es[j] = descriptors.Entry{Key: e.GetKey(), Value: e.GetValue()}
		}
		r.Descriptors[i].Entries = es
	}
	return r
}

func explain(ctx context.Context, ex Explainer, req *charonv1.ExplainRequest) (*charonv1.ExplainResponse, error) {
	xs, err := ex.Explain(ctx, engineRequest(req))
	if err != nil {
		return nil, err
	}
	resp := &charonv1.ExplainResponse{Explanations: make([]*charonv1.Explanation, len(xs))}
	for i := range xs {
		resp.Explanations[i] = toExplanation(&xs[i])
		if at := xs[i].View.At; !at.IsZero() {
			resp.At = timestamppb.New(at)
		}
	}
	return resp, nil
}

func toExplanation(x *engine.Explanation) *charonv1.Explanation {
	m := &x.Match
	out := &charonv1.Explanation{Limited: x.Limited, Reason: x.Reason}
	if m.Resource != "" {
		out.Target = &charonv1.Target{Resource: m.Resource, Domain: m.Domain}
	}
	if l := m.Limit; l != nil {
		out.Leaf = l.Where()
		out.Name = l.Name
	}
	if !x.Limited {
		return out
	}
	out.Override, out.Shadow, out.Quota, out.Summary = x.Override, x.Shadow, x.Quota, x.Summary
	out.Escrow = escrowUsage(x).proto()
	p, v := m.Policy, &x.View
	if q := x.CalendarQuota; q != nil {
		// A calendar quota is told in words beside the rate policy; alone,
		// it is the explanation's policy (kind "quota", its period's end
		// as the window's end).
		qs := "calendar quota (ends " + q.PeriodEnd.Format(time.RFC3339) + "): " + q.Summary
		if p == nil {
			p, v, out.Summary = q.Policy, &q.View, qs
		} else {
			out.Summary += "; " + qs
		}
	}
	out.Kind = p.Kind.String()
	out.HardLimit, out.GlobalLimit = p.HardLimit, p.GlobalLimit
	for i, tv := range v.Tiers {
		tr := &p.Tiers[i]
		ts := &charonv1.TierState{
			Limit: tr.Limit, Window: durationpb.New(tr.Window), Cooldown: durationpb.New(tr.Cooldown),
			Skippable: tr.Skippable, Phase: tv.Phase.String(), Hits: tv.Hits,
			EnteredAt: stamp(tv.EnteredAt), ActiveUntil: stamp(tv.ActiveUntil), CooldownUntil: stamp(tv.CooldownUntil),
		}
		if tr.Active != tiers.Unbounded {
			ts.Active = durationpb.New(tr.Active)
		}
		out.Tiers = append(out.Tiers, ts)
	}
	out.Tier, out.NextTier = int32(v.Tier), int32(v.NextTier)
	out.DomainHits, out.ResourceHits = v.DomainHits, v.ResourceHits
	out.Used, out.Capacity, out.WindowEnd = v.Used, v.Capacity, stamp(v.WindowEnd)
	out.Remaining = v.Remaining
	switch {
	case v.RetryAfter == tiers.Unbounded:
		out.RetryNever = true
	case v.RetryAfter > 0:
		out.RetryAfter = durationpb.New(v.RetryAfter)
	}
	if v.ResetAfter > 0 {
		out.ResetAfter = durationpb.New(v.ResetAfter)
	}
	out.Next = stamp(v.Next)
	return out
}

// stamp is t as a Timestamp, nil for the zero time.
func stamp(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

// protoEntries converts a descriptor's entries to the API's.
func protoEntries(es []descriptors.Entry) []*charonv1.Entry {
	out := make([]*charonv1.Entry, len(es))
	for i, e := range es {
		out[i] = &charonv1.Entry{Key: e.Key, Value: e.Value}
	}
	return out
}

// explainQuery reads ?domain=D&descriptor=k=v,k2=v2 (descriptor repeatable).
func explainQuery(r *http.Request) (*charonv1.ExplainRequest, error) {
	q := r.URL.Query()
	req := &charonv1.ExplainRequest{Domain: q.Get("domain")}
	if req.Domain == "" || len(q["descriptor"]) == 0 {
		return nil, errors.New("domain and descriptor are required: ?domain=D&descriptor=k=v,k2=v2 (descriptor repeatable)")
	}
	for _, d := range q["descriptor"] {
		es, err := descriptors.ParseDescriptor(d)
		if err != nil {
			return nil, err
		}
		req.Descriptors = append(req.Descriptors, &charonv1.ExplainRequest_Descriptor{Entries: protoEntries(es)})
	}
	return req, nil
}

// explainerQuery returns the engine's Explainer and the request's query,
// or answers the error and returns false.
func (c *Service) explainerQuery(w http.ResponseWriter, r *http.Request) (Explainer, *charonv1.ExplainRequest, bool) {
	ex, ok := c.engine.(Explainer)
	if !ok {
		server.HTTPError(w, errNoExplainer)
		return nil, nil, false
	}
	req, err := explainQuery(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return nil, nil, false
	}
	if r.URL.Query().Get("candidate") != "" {
		if ex, err = candidateExplainer(c.opts.Candidate); err != nil {
			server.HTTPError(w, err)
			return nil, nil, false
		}
	}
	return ex, req, true
}

// serveExplain is GET /explain on the debug port: Explain's answer as JSON.
func (c *Service) serveExplain(w http.ResponseWriter, r *http.Request) {
	ex, req, ok := c.explainerQuery(w, r)
	if !ok {
		return
	}
	resp, err := explain(r.Context(), ex, req)
	if err != nil {
		server.HTTPError(w, err)
		return
	}
	out, err := protojson.MarshalOptions{Multiline: true}.Marshal(resp)
	if err != nil {
		http.Error(w, "encoding response: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(out)
}

// serveReset is POST /reset on the debug port (with DebugReset): it forgets
// the state of the pairs the descriptors resolve to.
func (c *Service) serveReset(w http.ResponseWriter, r *http.Request) {
	ex, req, ok := c.explainerQuery(w, r)
	if !ok {
		return
	}
	n, err := ex.Reset(r.Context(), engineRequest(req))
	if err != nil {
		server.HTTPError(w, err)
		return
	}
	c.log.Info("pair state reset", "domain", descriptors.Truncate(req.Domain), "descriptor", descriptors.Truncate(strings.Join(r.URL.Query()["descriptor"], " ")), "pairs", n, "remote", r.RemoteAddr)
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, "{\"reset\": %d}\n", n)
}
