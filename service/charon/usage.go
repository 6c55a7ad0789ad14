package charon

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/server"
	"github.com/charonlimit/charon/tiers"
)

// Usage is the answer of GET /usage: per matched limit of each descriptor,
// how much of it is used and when it renews.
type Usage struct {
	// At is when the state was read; absent when no limit matched.
	At     time.Time    `json:"at,omitzero"`
	Limits []UsageLimit `json:"limits"`
}

// UsageLimit is one limit of a descriptor: its rate policy (kind "rate";
// "concurrency" for a concurrency limit, whose Used is the slots held) or
// its calendar quota (kind "quota").
type UsageLimit struct {
	Descriptor int    `json:"descriptor"`
	Resource   string `json:"resource"`
	Domain     string `json:"domain,omitempty"`
	Kind       string `json:"kind"`
	// Period is the quota's period ("month"), or the rate policy's
	// algorithm and current window ("tiers, 1m0s"; "in flight, ttl 5m0s"
	// for a concurrency limit).
	Period    string `json:"period"`
	Limit     int64  `json:"limit"`
	Used      int64  `json:"used"`
	Remaining int64  `json:"remaining"`
	// Renews is when Remaining next grows: the end of the quota's period,
	// or when the rate policy gives a hit back (absent when nothing is
	// pending, or never).
	Renews *time.Time `json:"renews,omitempty"`
	// Cooldown reports that a tier of the rate policy is in its cooldown.
	Cooldown bool `json:"cooldown,omitempty"`
	// Escrow, when this replica decides the pair from escrow leases, is
	// what they hold (Used and Remaining are Redis's, every replica's
	// leases counted as used).
	Escrow *EscrowUsage `json:"escrow,omitempty"`
}

// EscrowUsage is what this replica's escrow leases hold of a pair.
type EscrowUsage struct {
	Leases  int       `json:"leases"`
	Held    int64     `json:"held"`
	Granted int64     `json:"granted"`
	Until   time.Time `json:"until,omitzero"`
	Rate    float64   `json:"rate"`
	Demand  int64     `json:"demand"`
	Share   int64     `json:"share"`
}

// escrowUsage is x's escrow holding as an EscrowUsage; nil when x's pair
// is not in escrow on this replica.
func escrowUsage(x *engine.Explanation) *EscrowUsage {
	h := x.Escrow
	if h == nil {
		return nil
	}
	return &EscrowUsage{Leases: h.Leases, Held: h.Held, Granted: h.Granted, Until: h.Until.UTC(),
		Rate: h.Rate, Demand: h.Demand, Share: h.Share}
}

// usage reads, without changing anything, the usage of req's descriptors.
// A domain the configuration does not have is an *unknownDomainError
// (NotFound): a usage of nothing would look like a limit never used.
func usage(ctx context.Context, ex Explainer, req *engine.Request) (*Usage, error) {
	xs, err := ex.Explain(ctx, req)
	if err != nil {
		return nil, err
	}
	if len(xs) > 0 && xs[0].Reason == engine.ReasonUnknownDomain {
		return nil, newUnknownDomainError(req.Domain, ex)
	}
	out := &Usage{Limits: []UsageLimit{}}
	for i := range xs {
		x := &xs[i]
		if !x.Limited {
			continue
		}
		base := UsageLimit{Descriptor: i, Resource: x.Match.Resource, Domain: x.Match.Domain}
		if p := x.Match.Policy; p != nil {
			u, v := base, &x.View
			out.At = v.At
			u.Kind, u.Remaining = string(engine.ByRate), v.Remaining
			if p.Concurrency {
				u.Kind = "concurrency"
			}
			u.Limit, u.Used, u.Period = rateUsage(p, v)
			wait := v.ResetAfter
			if v.Remaining == 0 {
				wait = v.RetryAfter
			}
			if wait > 0 && wait != tiers.Unbounded {
				n := v.At.Add(wait).UTC()
				u.Renews = &n
			}
			for _, tv := range v.Tiers {
				u.Cooldown = u.Cooldown || tv.Phase == tiers.PhaseCooldown
			}
			u.Escrow = escrowUsage(x)
			out.Limits = append(out.Limits, u)
		}
		if q := x.CalendarQuota; q != nil {
			u := base
			out.At = q.View.At
			end := q.PeriodEnd.UTC()
			u.Kind, u.Period, u.Renews = string(engine.ByQuota), q.Policy.Quota.Period.String(), &end
			u.Limit, u.Used, u.Remaining = q.Policy.Quota.Limit, q.View.Used, q.View.Remaining
			out.Limits = append(out.Limits, u)
		}
	}
	return out, nil
}

// maxDomainsNamed bounds the domains an unknownDomainError lists.
const maxDomainsNamed = 10

// unknownDomainError is usage's answer for a domain the configuration does
// not have: NotFound, naming it and the first maxDomainsNamed domains
// there are (when the explainer tells them).
type unknownDomainError struct {
	domain string
	known  []string
	more   int
	listed bool
}

func newUnknownDomainError(domain string, ex Explainer) *unknownDomainError {
	e := &unknownDomainError{domain: descriptors.Truncate(domain)}
	t, ok := ex.(interface{ Tree() *descriptors.Tree })
	if !ok {
		return e
	}
	e.listed = true
	ds := t.Tree().Domains()
	for _, d := range ds[:min(len(ds), maxDomainsNamed)] {
		e.known = append(e.known, d.Name)
	}
	e.more = len(ds) - len(e.known)
	return e
}

func (e *unknownDomainError) Error() string {
	msg := fmt.Sprintf("domain %q is not configured", e.domain)
	switch {
	case !e.listed:
	case len(e.known) == 0:
		msg += ": the configuration has no domains (GET /rlconfig on the debug port shows it)"
	default:
		msg += "; configured: " + strings.Join(e.known, ", ")
		if e.more > 0 {
			msg += fmt.Sprintf(" and %d more (GET /rlconfig on the debug port lists them)", e.more)
		}
	}
	return msg
}

// GRPCStatus makes it NotFound for server.GRPCError and server.HTTPError.
func (e *unknownDomainError) GRPCStatus() *status.Status {
	return status.New(codes.NotFound, e.Error())
}

// rateUsage is a rate policy's limit, use and window as a view shows them:
// the current tier's (tier 1's when none is active) for burst tiers.
func rateUsage(p *tiers.Policy, v *tiers.View) (limit, used int64, period string) {
	switch p.Kind {
	case tiers.KindTiers:
		t := max(v.Tier, 1)
		if t > len(p.Tiers) || t > len(v.Tiers) {
			return 0, 0, "tiers (closed)"
		}
		if p.Concurrency {
			// The slots held, and how long a slot lives at most.
			return p.Tiers[0].Limit, v.Tiers[0].Hits, "in flight, ttl " + p.Tiers[0].Window.String()
		}
		return p.Tiers[t-1].Limit, v.Tiers[t-1].Hits, "tiers, " + p.Tiers[t-1].Window.String()
	case tiers.KindTokenBucket:
		return v.Capacity, v.Used, "token bucket"
	case tiers.KindFixedWindow:
		return v.Capacity, v.Used, "fixed window, " + p.Window.Unit.String()
	case tiers.KindQuota:
		// A rate limit in calendar units.
		return v.Capacity, v.Used, "calendar " + p.Quota.Period.String()
	}
	return v.Capacity, v.Used, p.Kind.String()
}

// serveUsage is GET /usage?domain=D&descriptor=k=v,k2=v2 on the HTTP port:
// Usage as JSON. It is a read (authz group read).
func (c *Service) serveUsage(w http.ResponseWriter, r *http.Request) {
	ex, req, ok := c.explainerQuery(w, r)
	if !ok {
		return
	}
	u, err := usage(r.Context(), ex, engineRequest(req))
	if err != nil {
		server.HTTPError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(u)
}
