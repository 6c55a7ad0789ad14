// Package charon serves the charon.v1 API: bulk Requests of rate-limited
// resources (internal/engine), the copy operations of copy-limited ones
// (internal/holds) on unary calls or Session streams, Explain and Usage,
// and their HTTP forms: GET /usage on the HTTP port, GET /explain and POST
// /reset on the debug port.
package charon

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
	"github.com/charonlimit/charon/copylog"
	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/authz"
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/internal/holds"
	"github.com/charonlimit/charon/server"
	"github.com/charonlimit/charon/tiers"
)

// Engine is what the charon.v1 service needs from the RLS pipeline;
// *engine.Engine implements it, and Explainer too (Explain, Usage and the
// debug port's /explain and /reset need it). Implementations must be safe
// for concurrent use.
type Engine interface {
	Request(ctx context.Context, domain string, entries []descriptors.Entry, copies, min int64) (engine.Result, error)
}

// Broker is what the copy operations of charon.v1 need from the copy-hold
// pipeline; *holds.Broker implements it. Implementations must be safe for
// concurrent use.
type Broker interface {
	Reserve(ctx context.Context, r holds.ReserveRequest) (holds.Reservation, error)
	Release(ctx context.Context, holdID string, copies int64) (copylog.ReleaseResult, error)
	Transfer(ctx context.Context, holdID string, copies int64, ttl time.Duration) (holds.Transferred, error)
	Seize(ctx context.Context, transferID, session string, lease time.Duration) (holds.Seized, error)
	KeepAlive(ctx context.Context, holdID string, lease time.Duration) (copylog.KeepAliveResult, error)
	KeepAliveSession(ctx context.Context, session string, lease time.Duration, resources []string) (copylog.KeepAliveResult, error)
	ReleaseSession(ctx context.Context, resource, session string) (copylog.SessionResult, error)
}

// Defaults of Options.
const (
	DefaultUnaryLease   = 30 * time.Second
	DefaultMaxLease     = 10 * time.Minute
	DefaultSessionLease = 10 * time.Second
	DefaultTransferTTL  = 30 * time.Second
	// sessionReleaseTimeout bounds the release of a session's holds after
	// its stream ended; past it the holds lapse with their lease.
	sessionReleaseTimeout = 5 * time.Second
)

// Options configure the charon.v1 service. The zero value uses the
// defaults above.
type Options struct {
	// UnaryLease is the lease of a unary Reserve or Seize, and of a
	// KeepAlive, that names none; MaxLease the longest a caller may ask.
	UnaryLease, MaxLease time.Duration
	// SessionLease is the lease of the holds of a Session stream, renewed
	// every SessionLease/3 while the stream lives: a server that dies loses
	// its sessions' holds within SessionLease, and a stream whose renewal
	// fails half a lease or more after the last that succeeded ends with
	// UNAVAILABLE before its holds can lapse unannounced.
	SessionLease time.Duration
	// TransferTTL is the ttl of a Transfer that names none.
	TransferTTL time.Duration
	// DebugReset serves POST /reset on the debug port, which forgets pairs'
	// state; the server must authenticate the debug port's clients
	// (server.Server.DebugAuthenticated).
	DebugReset bool

	// Set by the caller, not flags:
	//
	// Holds, when set, reports the copies held in the store (a gauge).
	Holds func() float64
	// Candidate, when set, explains under the candidate configuration
	// (package canary) the calls that ask for it (charonv1.CandidateHeader,
	// /explain?candidate=1).
	Candidate Explainer
}

// Bind declares --debug-reset on fs with o's value as default.
func (o *Options) Bind(fs *flag.FlagSet) {
	fs.BoolVar(&o.DebugReset, "debug-reset", o.DebugReset, "serve POST /reset on the debug port, which forgets pairs' state; needs --debug-token-file or --debug-tls with a client CA")
}

func (o *Options) defaults() {
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{{&o.UnaryLease, DefaultUnaryLease}, {&o.MaxLease, DefaultMaxLease}, {&o.SessionLease, DefaultSessionLease}, {&o.TransferTTL, DefaultTransferTTL}} {
		if *d.v <= 0 {
			*d.v = d.def
		}
	}
}

// Session ids are namespaced so that a unary caller, who names its session,
// can never name a stream's (random) session.
const (
	unarySessionPrefix  = "u:"
	streamSessionPrefix = "s:"
)

// Service implements charon.v1.Charon. Use New.
type Service struct {
	charonv1.UnimplementedCharonServer
	engine  Engine
	holds   Broker
	opts    Options
	metrics *charonMetrics
	log     *slog.Logger
	// closing is closed when the server shuts down: Session streams end,
	// releasing their holds, instead of holding up a graceful stop.
	closing chan struct{}
}

// New returns the service of eng's bulk requests and broker's copy
// operations (nil: they fail with holds.ErrNoCopyStore). It serves once
// registered on a server (server.New registers it): its metrics live in
// the server's registry.
func New(eng Engine, broker Broker, opts Options) *Service {
	opts.defaults()
	if broker == nil {
		broker = holds.New(holds.Options{})
	}
	return &Service{engine: eng, holds: broker, opts: opts, log: slog.New(slog.DiscardHandler), closing: make(chan struct{})}
}

// Register implements server.Service: the gRPC service, its metrics, the
// end of its Session streams when the shutdown begins, GET /usage on the
// HTTP port, GET /explain (and, with DebugReset, POST /reset) on the debug
// port. DebugReset on a debug port that does not authenticate its clients
// is an error.
func (c *Service) Register(s *server.Server) error {
	if c.opts.DebugReset && !s.DebugAuthenticated() {
		return errors.New("charon: DebugReset needs the debug port's authentication (a DebugToken, or a DebugTLS that verifies client certificates)")
	}
	c.log = s.Logger()
	c.metrics = newCharonMetrics(s.Metrics().Registry, c.opts.Holds)
	charonv1.RegisterCharonServer(s, c)
	s.OnShutdown(func() { close(c.closing) })
	s.HandleHTTP(server.Endpoint{Pattern: "GET /usage", Name: authz.Usage, Handler: http.HandlerFunc(c.serveUsage)})
	s.HandleDebug(server.Endpoint{Pattern: "GET /explain", Name: authz.DebugExplain, Handler: http.HandlerFunc(c.serveExplain),
		Index: "/explain?domain=D&descriptor=k=v,k2=v2: how a request resolves and its pairs' state (JSON)\n"})
	if c.opts.DebugReset {
		s.HandleDebug(server.Endpoint{Pattern: "POST /reset", Name: authz.DebugReset, Handler: http.HandlerFunc(c.serveReset),
			Index: "POST /reset?domain=D&descriptor=k=v,k2=v2: forget those pairs' state\n"})
	}
	return nil
}

// Request decides a bulk request of a rate-limited resource.
func (c *Service) Request(ctx context.Context, req *charonv1.RequestRequest) (*charonv1.RequestResponse, error) {
	resp, err := c.request(ctx, req)
	return resp, c.done("Request", err)
}

func (c *Service) request(ctx context.Context, req *charonv1.RequestRequest) (*charonv1.RequestResponse, error) {
	domain, entries := resourceOf(req.GetResource())
	r, err := c.engine.Request(ctx, domain, entries, req.GetCopies(), req.GetMinCopies())
	if err != nil {
		return nil, err
	}
	c.metrics.requested(r)
	return toRequestResponse(&r), nil
}

// Reserve reserves copies as a hold of the caller's unary session (or of
// its lease alone).
func (c *Service) Reserve(ctx context.Context, req *charonv1.ReserveRequest) (*charonv1.ReserveResponse, error) {
	resp, _, err := c.reserve(ctx, req, "", 0)
	return resp, c.done("Reserve", err)
}

// reserve runs a reserve; a stream passes its session and lease, a unary
// call "" and 0. It also returns the resource the reserve may have changed
// ("" when none), even on error: a stream must release it when it ends.
func (c *Service) reserve(ctx context.Context, req *charonv1.ReserveRequest, session string, lease time.Duration) (*charonv1.ReserveResponse, string, error) {
	er, err := c.holdOptions(req.GetSession(), req.GetLease(), session, lease)
	if err != nil {
		return nil, "", err
	}
	er.Domain, er.Entries = resourceOf(req.GetResource())
	er.Copies, er.Min, er.RequestID = req.GetCopies(), req.GetMinCopies(), req.GetRequestId()
	res, err := c.holds.Reserve(ctx, er)
	c.metrics.reaped(res.Reaped)
	if err != nil {
		return nil, res.Resource, err
	}
	c.metrics.reserved(res.Resource, res.OK)
	return toReserveResponse(&res), res.Resource, nil
}

// holdOptions resolves the session and lease of a new hold: a stream's, or
// the unary caller's session name and lease (the default when unset).
func (c *Service) holdOptions(name string, d *durationpb.Duration, session string, lease time.Duration) (holds.ReserveRequest, error) {
	if session != "" {
		return holds.ReserveRequest{Session: session, Lease: lease}, nil
	}
	l, err := c.duration(d, "lease", c.opts.UnaryLease)
	if err != nil {
		return holds.ReserveRequest{}, err
	}
	s, err := unarySession(name)
	return holds.ReserveRequest{Session: s, Lease: l}, err
}

// unarySession is the store's session of a unary caller's session name.
func unarySession(name string) (string, error) {
	if name == "" {
		return "", nil
	}
	if n := copylog.MaxIDLen - len(unarySessionPrefix); len(name) > n {
		return "", &descriptors.InputError{Field: "session", Message: fmt.Sprintf("%d bytes, longer than %d", len(name), n)}
	}
	return unarySessionPrefix + name, nil
}

// duration is a request's duration field, def when unset; it must lie in
// [holds.MinLease, MaxLease]. Checking here, where the field is known,
// names it: the copy store would refuse a sub-microsecond one as a "lease"
// out of its own, far wider, range.
func (c *Service) duration(d *durationpb.Duration, field string, def time.Duration) (time.Duration, error) {
	if d == nil {
		return def, nil
	}
	if err := d.CheckValid(); err != nil {
		return 0, &descriptors.InputError{Field: field, Message: err.Error()}
	}
	v := d.AsDuration()
	if v < holds.MinLease || v > c.opts.MaxLease {
		return 0, &descriptors.InputError{Field: field, Message: fmt.Sprintf("%v, want in [%v, %v]", v, holds.MinLease, c.opts.MaxLease)}
	}
	return v, nil
}

// Release gives back copies of a hold.
func (c *Service) Release(ctx context.Context, req *charonv1.ReleaseRequest) (*charonv1.ReleaseResponse, error) {
	resp, err := c.release(ctx, req)
	return resp, c.done("Release", err)
}

func (c *Service) release(ctx context.Context, req *charonv1.ReleaseRequest) (*charonv1.ReleaseResponse, error) {
	res, err := c.holds.Release(ctx, req.GetHoldId(), req.GetCopies())
	c.metrics.reaped(res.Reaped)
	if err != nil {
		return nil, err
	}
	return &charonv1.ReleaseResponse{Released: res.Released, Remaining: res.Left, DomainHolds: res.DomainHeld, TotalHolds: res.TotalHeld}, nil
}

// Transfer stages copies of a hold under a new transfer id.
func (c *Service) Transfer(ctx context.Context, req *charonv1.TransferRequest) (*charonv1.TransferResponse, error) {
	resp, err := c.transfer(ctx, req)
	return resp, c.done("Transfer", err)
}

func (c *Service) transfer(ctx context.Context, req *charonv1.TransferRequest) (*charonv1.TransferResponse, error) {
	ttl, err := c.duration(req.GetTtl(), "ttl", c.opts.TransferTTL)
	if err != nil {
		return nil, err
	}
	res, err := c.holds.Transfer(ctx, req.GetHoldId(), req.GetCopies(), ttl)
	c.metrics.reaped(res.Reaped)
	if err != nil {
		return nil, err
	}
	return &charonv1.TransferResponse{TransferId: res.TransferID, Copies: res.Copies, Remaining: res.Left, Expires: timestamppb.New(res.Expires)}, nil
}

// Seize turns staged copies into a hold of the caller.
func (c *Service) Seize(ctx context.Context, req *charonv1.SeizeRequest) (*charonv1.SeizeResponse, error) {
	resp, _, err := c.seize(ctx, req, "", 0)
	return resp, c.done("Seize", err)
}

// seize runs a seize and returns the resource it touched ("" when none).
func (c *Service) seize(ctx context.Context, req *charonv1.SeizeRequest, session string, lease time.Duration) (*charonv1.SeizeResponse, string, error) {
	ho, err := c.holdOptions(req.GetSession(), req.GetLease(), session, lease)
	if err != nil {
		return nil, "", err
	}
	res, err := c.holds.Seize(ctx, req.GetTransferId(), ho.Session, ho.Lease)
	c.metrics.reaped(res.Reaped)
	if err != nil {
		return nil, res.Resource, err
	}
	return &charonv1.SeizeResponse{
		HoldId: res.HoldID, Copies: res.Copies, FencingToken: res.Token,
		LeaseExpires:  timestamppb.New(res.Expires),
		Target:        &charonv1.Target{Resource: res.Resource, Domain: res.Domain},
		Groups:        res.Groups,
		CurrentGroups: res.CurrentGroups,
	}, res.Resource, nil
}

// KeepAlive extends the lease of a hold or of a unary session's holds.
func (c *Service) KeepAlive(ctx context.Context, req *charonv1.KeepAliveRequest) (*charonv1.KeepAliveResponse, error) {
	resp, err := c.keepAlive(ctx, req)
	return resp, c.done("KeepAlive", err)
}

func (c *Service) keepAlive(ctx context.Context, req *charonv1.KeepAliveRequest) (*charonv1.KeepAliveResponse, error) {
	lease, err := c.duration(req.GetLease(), "lease", c.opts.UnaryLease)
	if err != nil {
		return nil, err
	}
	var res copylog.KeepAliveResult
	switch t := req.GetTarget().(type) {
	case *charonv1.KeepAliveRequest_HoldId:
		res, err = c.holds.KeepAlive(ctx, t.HoldId, lease)
	case *charonv1.KeepAliveRequest_Session:
		var s string
		if s, err = unarySession(t.Session); err == nil {
			if s == "" {
				return nil, &descriptors.InputError{Field: "session", Message: "empty"}
			}
			res, err = c.holds.KeepAliveSession(ctx, s, lease, nil)
		}
	default:
		return nil, &descriptors.InputError{Field: "target", Message: "neither session nor hold_id"}
	}
	c.metrics.reaped(res.Reaped)
	if err != nil {
		return nil, err
	}
	return toKeepAliveResponse(res), nil
}

func toKeepAliveResponse(res copylog.KeepAliveResult) *charonv1.KeepAliveResponse {
	out := &charonv1.KeepAliveResponse{Holds: int32(min(res.Holds, 1<<31-1))}
	if res.Holds > 0 {
		out.LeaseExpires = timestamppb.New(res.Expires)
	}
	return out
}

// done maps err to gRPC (logging failures) and counts the call.
func (c *Service) done(method string, err error) error {
	gerr := server.GRPCError(err)
	code := status.Code(gerr)
	c.metrics.call(method, code)
	switch code {
	case codes.OK:
	case codes.Unavailable, codes.Internal, codes.Unknown, codes.Aborted:
		c.log.Warn("charon.v1 call failed", "method", method, "code", code.String(), "err", descriptors.Truncate(err.Error()))
	default:
		c.log.Debug("charon.v1 call refused", "method", method, "code", code.String(), "err", descriptors.Truncate(err.Error()))
	}
	return gerr
}

// resourceOf converts a proto resource to the domain and entries that both
// pipelines (engine, holds) take.
func resourceOf(r *charonv1.Resource) (string, []descriptors.Entry) {
	pes := r.GetEntries()
	es := make([]descriptors.Entry, len(pes))
	for i, e := range pes {
		es[i] = descriptors.Entry{Key: e.GetKey(), Value: e.GetValue()}
	}
	return r.GetDomain(), es
}

func toRequestResponse(r *engine.Result) *charonv1.RequestResponse {
	d := &r.Decision
	out := &charonv1.RequestResponse{
		Ok: d.OK, Granted: d.Granted,
		Target:          &charonv1.Target{Resource: r.Match.Resource, Domain: r.Match.Domain},
		HardLimit:       d.HardLimit,
		GlobalLimit:     d.GlobalLimit,
		Tier:            int32(d.Tier),
		TierLimit:       d.TierLimit,
		TierHits:        d.TierHits,
		DomainHits:      d.DomainHits,
		ResourceHits:    d.ResourceHits,
		Burst:           d.Burst,
		LimitedByHard:   d.LimitedByHard,
		LimitedByGlobal: d.LimitedByGlobal,
		Remaining:       d.Remaining,
	}
	if d.TierWindow > 0 {
		out.TierWindow = durationpb.New(d.TierWindow)
	}
	switch {
	case d.OK:
		if d.ResetAfter > 0 && d.ResetAfter != tiers.Unbounded {
			out.ResetAfter = durationpb.New(d.ResetAfter)
		}
	case d.RetryAfter == tiers.Unbounded:
		out.RetryNever = true
	default:
		out.RetryAfter = durationpb.New(d.RetryAfter)
	}
	return out
}

func toReserveResponse(r *holds.Reservation) *charonv1.ReserveResponse {
	out := &charonv1.ReserveResponse{
		Ok: r.OK, Granted: r.Granted, HoldId: r.HoldID, FencingToken: r.Token,
		Target:          &charonv1.Target{Resource: r.Resource, Domain: r.Domain},
		Groups:          r.Groups,
		Replayed:        r.Replayed,
		HoldGone:        r.HoldGone,
		LimitedByDomain: r.LimitedByDomain,
		LimitedByGlobal: r.LimitedByGlobal,
		LimitedByGroup:  r.LimitedByGroup,
		Context: &charonv1.CopyContext{
			DomainLimit: r.Context.DomainLimit,
			GlobalLimit: r.Context.GlobalLimit,
			DomainHolds: r.Context.DomainHeld,
			TotalHolds:  r.Context.TotalHeld,
		},
	}
	if r.OK {
		out.LeaseExpires = timestamppb.New(r.Expires)
	}
	for _, g := range r.Context.Groups {
		out.Context.Groups = append(out.Context.Groups, &charonv1.GroupContext{Name: g.Name, Limit: g.Limit, Holds: g.Held})
	}
	return out
}
