package charon

import (
	"context"
	"errors"
	"io"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/holds"
	"github.com/charonlimit/charon/server"
)

// session is the state of one Session stream. Only the stream's own
// goroutine touches it.
type session struct {
	id string
	// resources are those where the session may hold copies: every
	// resource a reserve or seize on the stream reached.
	resources []string
	// renewed is a time by which every hold of the session had a lease of
	// SessionLease: when the last successful renewal began or, before any,
	// when the first reserve or seize that reached a resource began (zero
	// until then). A later reserve or seize does not move it: it sets the
	// lease of its own hold, not those of the others.
	//
	// It is monotonic time, as the ticker's, rather than a count of failed
	// ticks: a ticker drops ticks while the loop is busy with an operation
	// (a slow store delays both), so ticks undercount the time the holds
	// went unrenewed.
	renewed time.Time
}

// touch records that an operation begun at start reached resource.
func (s *session) touch(resource string, start time.Time) {
	if resource == "" || slices.Contains(s.resources, resource) {
		return
	}
	s.resources = append(s.resources, resource)
	if s.renewed.IsZero() {
		s.renewed = start
	}
}

// lapsing reports whether, a renewal having failed at now, the session's
// holds may lapse before the next renewal: half a lease or more has gone
// since renewed, and the next try comes a third of a lease later at best
// (later on a busy machine or a slow store).
func (s *session) lapsing(now time.Time, lease time.Duration) bool {
	return !s.renewed.IsZero() && now.Sub(s.renewed) >= lease/2
}

// Session serves one stream: it runs the stream's operations in order,
// renews the leases of its holds every SessionLease/3, and releases them
// all when the stream ends, however it ends (the client closes it or
// exits, the connection breaks or misses its keepalives, the server shuts
// down, renewals keep failing). The server ends the stream with
// UNAVAILABLE when a renewal fails half a lease or more after the last one
// that succeeded: its holds could lapse, and be granted to others, before
// the next, and a client must learn it has lost them.
func (c *Service) Session(stream grpc.BidiStreamingServer[charonv1.SessionRequest, charonv1.SessionResponse]) error {
	err := c.session(stream)
	c.metrics.call("Session", status.Code(server.GRPCError(err)))
	return err
}

func (c *Service) session(stream grpc.BidiStreamingServer[charonv1.SessionRequest, charonv1.SessionResponse]) error {
	ctx := stream.Context()
	id, err := holds.NewSessionID()
	if err != nil {
		return status.Errorf(codes.Internal, "minting a session id: %v", err)
	}
	s := &session{id: streamSessionPrefix + id}
	c.metrics.sessions.Inc()
	defer c.metrics.sessions.Dec()
	defer c.endSession(ctx, s)

	reqs := make(chan *charonv1.SessionRequest)
	recvErr := make(chan error, 1)
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			req, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case reqs <- req:
			case <-done:
				return
			}
		}
	}()
	tick := time.NewTicker(c.opts.SessionLease / 3)
	defer tick.Stop()
	for {
		select {
		case req := <-reqs:
			if err := stream.Send(c.sessionOp(ctx, s, req)); err != nil {
				return err
			}
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-tick.C:
			if _, err := c.renew(ctx, s); err != nil && ctx.Err() == nil && s.lapsing(time.Now(), c.opts.SessionLease) {
				c.log.Warn("ending a session whose lease could not be renewed", "resources", len(s.resources), "since", time.Since(s.renewed))
				return status.Errorf(codes.Unavailable, "session lease could not be renewed, its holds are dropped: %s", descriptors.Truncate(err.Error()))
			}
		case <-c.closing:
			return status.Error(codes.Unavailable, "server shutting down")
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

// renew extends the leases of the session's holds, and records when it
// began if it succeeded.
func (c *Service) renew(ctx context.Context, s *session) (int, error) {
	if len(s.resources) == 0 {
		return 0, nil
	}
	start := time.Now() // the store's now is no earlier: the leases run at least from here
	res, err := c.holds.KeepAliveSession(ctx, s.id, c.opts.SessionLease, s.resources)
	c.metrics.reaped(res.Reaped)
	if err != nil {
		if ctx.Err() == nil {
			// The holds lapse within SessionLease if this goes on; the
			// loop ends the stream before they can.
			c.log.Warn("session lease renewal failed", "resources", len(s.resources), "err", descriptors.Truncate(err.Error()))
		}
		return res.Holds, err
	}
	s.renewed = start
	return res.Holds, nil
}

// endSession releases every hold of the session, on a context that
// outlives the stream's.
func (c *Service) endSession(streamCtx context.Context, s *session) {
	if len(s.resources) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(streamCtx), sessionReleaseTimeout)
	defer cancel()
	for _, r := range s.resources {
		res, err := c.holds.ReleaseSession(ctx, r, s.id)
		c.metrics.reaped(res.Reaped)
		if err != nil {
			c.log.Warn("releasing a session's holds failed; they lapse with their lease", "resource", descriptors.Truncate(r), "lease", c.opts.SessionLease, "err", descriptors.Truncate(err.Error()))
			continue
		}
		c.metrics.sessionReleased.Add(float64(res.Holds))
	}
}

// sessionOp runs one operation of the stream and answers it with its
// correlation id; a failed operation is an Error answer, the stream goes on.
func (c *Service) sessionOp(ctx context.Context, s *session, req *charonv1.SessionRequest) *charonv1.SessionResponse {
	out := &charonv1.SessionResponse{Id: req.GetId()}
	start := time.Now()
	var err error
	method := "Session"
	switch op := req.GetOperation().(type) {
	case *charonv1.SessionRequest_Request:
		method = "Request"
		var r *charonv1.RequestResponse
		if r, err = c.request(ctx, op.Request); err == nil {
			out.Result = &charonv1.SessionResponse_Request{Request: r}
		}
	case *charonv1.SessionRequest_Reserve:
		method = "Reserve"
		var r *charonv1.ReserveResponse
		var resource string
		r, resource, err = c.reserve(ctx, op.Reserve, s.id, c.opts.SessionLease)
		s.touch(resource, start)
		if err == nil {
			out.Result = &charonv1.SessionResponse_Reserve{Reserve: r}
		}
	case *charonv1.SessionRequest_Release:
		method = "Release"
		var r *charonv1.ReleaseResponse
		if r, err = c.release(ctx, op.Release); err == nil {
			out.Result = &charonv1.SessionResponse_Release{Release: r}
		}
	case *charonv1.SessionRequest_Transfer:
		method = "Transfer"
		var r *charonv1.TransferResponse
		if r, err = c.transfer(ctx, op.Transfer); err == nil {
			out.Result = &charonv1.SessionResponse_Transfer{Transfer: r}
		}
	case *charonv1.SessionRequest_Seize:
		method = "Seize"
		var r *charonv1.SeizeResponse
		var resource string
		r, resource, err = c.seize(ctx, op.Seize, s.id, c.opts.SessionLease)
		s.touch(resource, start)
		if err == nil {
			out.Result = &charonv1.SessionResponse_Seize{Seize: r}
		}
	case *charonv1.SessionRequest_KeepAlive:
		method = "KeepAlive"
		var r *charonv1.KeepAliveResponse
		if op.KeepAlive.GetTarget() == nil {
			// No target: keep the stream's own holds alive now.
			var holds int
			holds, err = c.renew(ctx, s)
			r = &charonv1.KeepAliveResponse{Holds: int32(min(holds, 1<<31-1))}
		} else {
			r, err = c.keepAlive(ctx, op.KeepAlive)
		}
		if err == nil {
			out.Result = &charonv1.SessionResponse_KeepAlive{KeepAlive: r}
		}
	default:
		err = &descriptors.InputError{Field: "operation", Message: "missing"}
	}
	if gerr := c.done(method, err); gerr != nil {
		st := status.Convert(gerr)
		out.Result = &charonv1.SessionResponse_Error{Error: &charonv1.Error{Code: int32(st.Code()), Message: st.Message()}}
	}
	return out
}
