package client_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/durationpb"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
	"github.com/charonlimit/charon/client"
)

// fake is a charon.v1 server with one pool per resource: a copy-limited
// resource has a limit on the copies held, a rate-limited one a number of
// hits left. Holds reserved or seized on a Session stream are released when
// the stream ends, as the real server does.
type fake struct {
	charonv1.UnimplementedCharonServer

	mu        sync.Mutex
	copyLimit map[string]int64 // resource key -> limit
	hitsLeft  map[string]int64 // resource key -> hits left
	held      map[string]int64
	holds     map[string]*fakeHold
	transfers map[string]*fakeHold
	seq       int
	sessions  int

	// Behaviour knobs, set under mu or before use.
	rejectN    int           // reject the next n requests and reserves
	err        error         // every call fails with it
	retryAfter time.Duration // sent with rate rejections
	never      bool          // rate rejections say retry_never
	onCall     func()        // called at every Request and Reserve
	gate       chan struct{} // when set, Reserve waits for it
	deaf       chan struct{} // when set, Session streams read nothing more until it is closed
	kill       chan struct{} // closing it breaks every Session stream
	calls      int
	keepAlives int
	events     chan string // "release <hold>" after every release, when set
}

type fakeHold struct {
	res     string
	copies  int64
	session int
}

func newFake() *fake {
	return &fake{
		copyLimit: map[string]int64{},
		hitsLeft:  map[string]int64{},
		held:      map[string]int64{},
		holds:     map[string]*fakeHold{},
		transfers: map[string]*fakeHold{},
		kill:      make(chan struct{}),
	}
}

func key(r *charonv1.Resource) string {
	parts := []string{r.GetDomain()}
	for _, e := range r.GetEntries() {
		parts = append(parts, e.GetKey()+"="+e.GetValue())
	}
	return strings.Join(parts, "/")
}

func (f *fake) heldOf(res string) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.held[res]
}

func (f *fake) holdIDs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []string
	for id := range f.holds {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// prologue counts a call and answers the injected error or rejection.
func (f *fake) prologue() (reject bool, err error) {
	f.mu.Lock()
	f.calls++
	hook := f.onCall
	err = f.err
	if f.rejectN > 0 {
		f.rejectN--
		reject = true
	}
	f.mu.Unlock()
	if hook != nil {
		hook()
	}
	return reject, err
}

func (f *fake) Request(ctx context.Context, req *charonv1.RequestRequest) (*charonv1.RequestResponse, error) {
	reject, err := f.prologue()
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	k, left, err := configured(req.GetResource(), f.hitsLeft, f.copyLimit, "copy-limited: reserve it")
	if err != nil {
		return nil, err
	}
	n := min(req.GetCopies(), left)
	if reject || n < req.GetMinCopies() || (n == 0 && req.GetCopies() > 0) {
		r := &charonv1.RequestResponse{Target: &charonv1.Target{Resource: k}, RetryNever: f.never}
		if !f.never {
			r.RetryAfter = durationpb.New(f.retryAfter)
		}
		return r, nil
	}
	f.hitsLeft[k] -= n
	return &charonv1.RequestResponse{Ok: true, Granted: n, Target: &charonv1.Target{Resource: k}, Remaining: f.hitsLeft[k]}, nil
}

// configured returns resource r's key and its number in limits, the map of
// the kind of limit the call wants; a resource in other, the other kind, is
// refused as one that is otherKind.
func configured(r *charonv1.Resource, limits, other map[string]int64, otherKind string) (string, int64, error) {
	k := key(r)
	n, ok := limits[k]
	if !ok {
		if _, isOther := other[k]; isOther {
			return k, 0, status.Errorf(codes.FailedPrecondition, "resource %s is %s", k, otherKind)
		}
		return k, 0, status.Errorf(codes.NotFound, "resource %s: not configured", k)
	}
	return k, n, nil
}

func (f *fake) reserve(ctx context.Context, req *charonv1.ReserveRequest, session int) (*charonv1.ReserveResponse, error) {
	reject, err := f.prologue()
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	gate := f.gate
	f.mu.Unlock()
	if gate != nil {
		<-gate
	}
	if req.GetCopies() < 1 {
		return nil, status.Error(codes.InvalidArgument, "copies: must be >= 1")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	k, limit, err := configured(req.GetResource(), f.copyLimit, f.hitsLeft, "rate-limited: request it")
	if err != nil {
		return nil, err
	}
	n := min(req.GetCopies(), limit-f.held[k])
	ctxt := &charonv1.CopyContext{DomainLimit: limit, DomainHolds: f.held[k], TotalHolds: f.held[k]}
	if reject || n < max(req.GetMinCopies(), 1) {
		return &charonv1.ReserveResponse{Target: &charonv1.Target{Resource: k}, Context: ctxt}, nil
	}
	f.seq++
	id := fmt.Sprintf("h%d", f.seq)
	f.holds[id] = &fakeHold{res: k, copies: n, session: session}
	f.held[k] += n
	ctxt.DomainHolds, ctxt.TotalHolds = f.held[k], f.held[k]
	return &charonv1.ReserveResponse{
		Ok: true, Granted: n, HoldId: id, FencingToken: int64(f.seq),
		Target: &charonv1.Target{Resource: k, Domain: "d"}, Groups: []string{"g"}, Context: ctxt,
	}, nil
}

func (f *fake) Reserve(ctx context.Context, req *charonv1.ReserveRequest) (*charonv1.ReserveResponse, error) {
	return f.reserve(ctx, req, 0)
}

func (f *fake) Release(ctx context.Context, req *charonv1.ReleaseRequest) (*charonv1.ReleaseResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	h, n, err := f.takeLocked(req.GetHoldId(), req.GetCopies())
	if err != nil {
		return nil, err
	}
	f.releaseLocked(req.GetHoldId(), n)
	return &charonv1.ReleaseResponse{Released: n, Remaining: h.copies, TotalHolds: f.held[h.res]}, nil
}

// takeLocked finds hold id and checks that it has n copies to give up, all
// of them when n is 0; it returns the hold and the copies.
func (f *fake) takeLocked(id string, n int64) (*fakeHold, int64, error) {
	h, ok := f.holds[id]
	if !ok {
		return nil, 0, status.Errorf(codes.NotFound, "hold_id %q: unknown hold", id)
	}
	if n == 0 {
		n = h.copies
	}
	if n > h.copies {
		return nil, 0, status.Errorf(codes.OutOfRange, "copies: %d, the hold has %d", n, h.copies)
	}
	return h, n, nil
}

func (f *fake) releaseLocked(id string, n int64) {
	h := f.holds[id]
	h.copies -= n
	f.held[h.res] -= n
	if h.copies == 0 {
		delete(f.holds, id)
	}
	if f.events != nil {
		f.events <- "release " + id
	}
}

func (f *fake) Transfer(ctx context.Context, req *charonv1.TransferRequest) (*charonv1.TransferResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	h, n, err := f.takeLocked(req.GetHoldId(), req.GetCopies())
	if err != nil {
		return nil, err
	}
	f.seq++
	tid := fmt.Sprintf("t%d", f.seq)
	f.transfers[tid] = &fakeHold{res: h.res, copies: n}
	h.copies -= n
	if h.copies == 0 {
		delete(f.holds, req.GetHoldId())
	}
	return &charonv1.TransferResponse{TransferId: tid, Copies: n, Remaining: h.copies}, nil
}

func (f *fake) seize(req *charonv1.SeizeRequest, session int) (*charonv1.SeizeResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, ok := f.transfers[req.GetTransferId()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "transfer_id: unknown, expired or seized")
	}
	delete(f.transfers, req.GetTransferId())
	f.seq++
	id := fmt.Sprintf("h%d", f.seq)
	t.session = session
	f.holds[id] = t
	return &charonv1.SeizeResponse{HoldId: id, Copies: t.copies, FencingToken: int64(f.seq), Target: &charonv1.Target{Resource: t.res, Domain: "d"}}, nil
}

// keepAlive answers a keep-alive of one hold, as the server does: NotFound
// when the hold is unknown. Leases are not modelled.
func (f *fake) keepAlive(req *charonv1.KeepAliveRequest) (*charonv1.KeepAliveResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.keepAlives++
	id := req.GetHoldId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "target: only hold_id in the fake")
	}
	if _, ok := f.holds[id]; !ok {
		return nil, status.Errorf(codes.NotFound, "hold_id %q: unknown hold", id)
	}
	return &charonv1.KeepAliveResponse{Holds: 1}, nil
}

func (f *fake) Seize(ctx context.Context, req *charonv1.SeizeRequest) (*charonv1.SeizeResponse, error) {
	return f.seize(req, 0)
}

func (f *fake) Session(stream charonv1.Charon_SessionServer) error {
	f.mu.Lock()
	f.sessions++
	sid := f.sessions
	kill := f.kill
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		for id, h := range f.holds {
			if h.session == sid {
				f.releaseLocked(id, h.copies)
			}
		}
	}()

	reqs := make(chan *charonv1.SessionRequest)
	errs := make(chan error, 1)
	quit := make(chan struct{})
	defer close(quit)
	go func() {
		for {
			r, err := stream.Recv()
			if err != nil {
				errs <- err
				return
			}
			// A deaf server, like a hung one, leaves r unanswered and
			// reads no more: the stream's flow-control window fills.
			f.mu.Lock()
			deaf := f.deaf
			f.mu.Unlock()
			if deaf != nil {
				select {
				case <-deaf:
				case <-quit:
					return
				}
			}
			select {
			case reqs <- r:
			case <-quit:
				return
			}
		}
	}()
	var wg sync.WaitGroup
	defer wg.Wait()
	var sendMu sync.Mutex
	for {
		select {
		case <-kill:
			return status.Error(codes.Unavailable, "fake: session killed")
		case <-stream.Context().Done():
			return status.FromContextError(stream.Context().Err()).Err()
		case err := <-errs:
			if err == io.EOF {
				return nil
			}
			return err
		case r := <-reqs:
			// Operations run concurrently, as on the real server.
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp := f.dispatch(stream.Context(), r, sid)
				sendMu.Lock()
				defer sendMu.Unlock()
				_ = stream.Send(resp)
			}()
		}
	}
}

func (f *fake) dispatch(ctx context.Context, r *charonv1.SessionRequest, sid int) *charonv1.SessionResponse {
	out := &charonv1.SessionResponse{Id: r.GetId()}
	var err error
	switch op := r.GetOperation().(type) {
	case *charonv1.SessionRequest_Request:
		var x *charonv1.RequestResponse
		x, err = f.Request(ctx, op.Request)
		out.Result = &charonv1.SessionResponse_Request{Request: x}
	case *charonv1.SessionRequest_Reserve:
		var x *charonv1.ReserveResponse
		x, err = f.reserve(ctx, op.Reserve, sid)
		out.Result = &charonv1.SessionResponse_Reserve{Reserve: x}
	case *charonv1.SessionRequest_Release:
		var x *charonv1.ReleaseResponse
		x, err = f.Release(ctx, op.Release)
		out.Result = &charonv1.SessionResponse_Release{Release: x}
	case *charonv1.SessionRequest_Transfer:
		var x *charonv1.TransferResponse
		x, err = f.Transfer(ctx, op.Transfer)
		out.Result = &charonv1.SessionResponse_Transfer{Transfer: x}
	case *charonv1.SessionRequest_Seize:
		var x *charonv1.SeizeResponse
		x, err = f.seize(op.Seize, sid)
		out.Result = &charonv1.SessionResponse_Seize{Seize: x}
	case *charonv1.SessionRequest_KeepAlive:
		var x *charonv1.KeepAliveResponse
		x, err = f.keepAlive(op.KeepAlive)
		out.Result = &charonv1.SessionResponse_KeepAlive{KeepAlive: x}
	default:
		err = status.Error(codes.InvalidArgument, "operation: unsupported by the fake")
	}
	if err != nil {
		s := status.Convert(err)
		out.Result = &charonv1.SessionResponse_Error{Error: &charonv1.Error{Code: int32(s.Code()), Message: s.Message()}}
	}
	return out
}

// serve runs f over an in-memory connection until the test ends, and
// returns a connection to it and a function that stops the server.
func serve(t testing.TB, f *fake, opts ...grpc.ServerOption) (*grpc.ClientConn, func()) {
	t.Helper()
	conn, stop, err := start(f, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		stop()
	})
	return conn, stop
}

// start runs f, with opts, over an in-memory connection; stop stops the
// server, not the connection.
func start(f *fake, opts ...grpc.ServerOption) (conn *grpc.ClientConn, stop func(), err error) {
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(opts...)
	charonv1.RegisterCharonServer(srv, f)
	go func() { _ = srv.Serve(lis) }()
	conn, err = grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		srv.Stop()
		return nil, nil, err
	}
	var once sync.Once
	return conn, func() { once.Do(srv.Stop) }, nil
}

// clock is a fake clock whose Sleep records the sleep and moves time on.
type clock struct {
	mu     sync.Mutex
	now    time.Time
	sleeps []time.Duration
}

func newClock() *clock { return &clock{now: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func (c *clock) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sleeps = append(c.sleeps, d)
	c.now = c.now.Add(d)
	return nil
}

func (c *clock) Sleeps() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.sleeps...)
}

// fakeClient returns a new fake whose rate-limited resource, rateRes, has
// hits hits left and whose copy-limited resource, copyRes, has a limit of
// copies, and a client of it with the fake clock and opts.
func fakeClient(t testing.TB, hits, copies int64, opts client.Options) (*fake, *client.Client, *clock) {
	t.Helper()
	f := newFake()
	f.hitsLeft[rateKey] = hits
	f.copyLimit[copyKey] = copies
	c, clk := newClient(t, f, opts)
	return f, c, clk
}

// newClient returns a client of f with the fake clock and opts.
func newClient(t testing.TB, f *fake, opts client.Options) (*client.Client, *clock) {
	t.Helper()
	conn, _ := serve(t, f)
	clk := newClock()
	opts.Now, opts.Sleep = clk.Now, clk.Sleep
	c := client.New(conn, opts)
	t.Cleanup(func() { _ = c.Close() })
	return c, clk
}
