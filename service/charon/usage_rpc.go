package charon

import (
	"context"

	"google.golang.org/protobuf/types/known/timestamppb"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
)

// Usage implements charon.v1.Charon: GET /usage's answer over gRPC, made by
// the same usage function.
func (c *Service) Usage(ctx context.Context, req *charonv1.UsageRequest) (*charonv1.UsageResponse, error) {
	ex, ok := c.engine.(Explainer)
	if !ok {
		return nil, c.done("Usage", errNoExplainer)
	}
	u, err := usage(ctx, ex, engineRequest(&charonv1.ExplainRequest{Domain: req.GetDomain(), Descriptors: req.GetDescriptors()}))
	if err != nil {
		return nil, c.done("Usage", err)
	}
	return u.proto(), c.done("Usage", nil)
}

// proto is u as a charon.v1 UsageResponse.
func (u *Usage) proto() *charonv1.UsageResponse {
	resp := &charonv1.UsageResponse{Limits: make([]*charonv1.UsageLimit, len(u.Limits))}
	if !u.At.IsZero() {
		resp.At = timestamppb.New(u.At)
	}
	for i, l := range u.Limits {
		p := &charonv1.UsageLimit{DescriptorIndex: int32(l.Descriptor), Resource: l.Resource, Domain: l.Domain, Kind: l.Kind,
			Period: l.Period, Limit: l.Limit, Used: l.Used, Remaining: l.Remaining, Cooldown: l.Cooldown}
		if l.Renews != nil {
			p.Renews = timestamppb.New(*l.Renews)
		}
		p.Escrow = l.Escrow.proto()
		resp.Limits[i] = p
	}
	return resp
}

// proto is e as a charon.v1 EscrowHolding; nil for nil (the pair is not
// in escrow on this replica).
func (e *EscrowUsage) proto() *charonv1.EscrowHolding {
	if e == nil {
		return nil
	}
	p := &charonv1.EscrowHolding{Leases: int32(e.Leases), Held: e.Held, Granted: e.Granted, Rate: e.Rate, Demand: e.Demand, Share: e.Share}
	if !e.Until.IsZero() {
		p.Until = timestamppb.New(e.Until)
	}
	return p
}
