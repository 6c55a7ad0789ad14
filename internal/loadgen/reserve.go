package loadgen

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
)

// reservePair runs Reserve + Release pairs of one copy on one Session
// stream, the way the Go client holds copies, or (unary) as two unary
// calls.
type reservePair struct {
	ctx    context.Context
	unary  charonv1.CharonClient // nil: on the stream
	stream grpc.BidiStreamingClient[charonv1.SessionRequest, charonv1.SessionResponse]
	id     uint64
	res    charonv1.ReserveRequest
	rel    charonv1.ReleaseRequest
	domain string
	key    string
}

func newReservePair(ctx context.Context, cc grpc.ClientConnInterface, domain, key string, unary bool) (*reservePair, error) {
	p := &reservePair{ctx: ctx, domain: domain, key: key}
	c := charonv1.NewCharonClient(cc)
	if unary {
		p.unary = c
	} else {
		st, err := c.Session(ctx)
		if err != nil {
			return nil, err
		}
		p.stream = st
	}
	p.res.Copies, p.res.MinCopies = 1, 1
	p.res.Resource = &charonv1.Resource{Domain: domain, Entries: []*charonv1.Entry{{Key: key}}}
	return p, nil
}

// do reserves one copy for value and releases it; ok is false when the
// reserve was rejected (nothing to release then).
func (p *reservePair) do(value string) (ok bool, err error) {
	p.res.Resource.Entries[0].Value = value
	if p.unary != nil {
		rr, err := p.unary.Reserve(p.ctx, &p.res)
		if err != nil || !rr.GetOk() {
			return false, err
		}
		p.rel.HoldId, p.rel.Copies = rr.GetHoldId(), 0
		_, err = p.unary.Release(p.ctx, &p.rel)
		return true, err
	}
	r, err := p.call(&charonv1.SessionRequest{Operation: &charonv1.SessionRequest_Reserve{Reserve: &p.res}})
	if err != nil {
		return false, err
	}
	rr := r.GetReserve()
	if rr == nil {
		return false, fmt.Errorf("reserve: unexpected answer %T", r.GetResult())
	}
	if !rr.GetOk() {
		return false, nil
	}
	p.rel.HoldId, p.rel.Copies = rr.GetHoldId(), 0
	r, err = p.call(&charonv1.SessionRequest{Operation: &charonv1.SessionRequest_Release{Release: &p.rel}})
	if err != nil {
		return true, err
	}
	if r.GetRelease() == nil {
		return true, fmt.Errorf("release: unexpected answer %T", r.GetResult())
	}
	return true, nil
}

func (p *reservePair) call(req *charonv1.SessionRequest) (*charonv1.SessionResponse, error) {
	p.id++
	req.Id = p.id
	if err := p.stream.Send(req); err != nil {
		return nil, err
	}
	resp, err := p.stream.Recv()
	if err != nil {
		return nil, err
	}
	if resp.GetId() != req.Id {
		return nil, fmt.Errorf("answer %d to request %d", resp.GetId(), req.Id)
	}
	if e := resp.GetError(); e != nil {
		return nil, errors.New(e.GetMessage())
	}
	return resp, nil
}
