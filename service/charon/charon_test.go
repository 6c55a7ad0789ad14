package charon

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
	"github.com/charonlimit/charon/copylog"
	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/copystore"
	"github.com/charonlimit/charon/internal/copystore/memcopy"
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/internal/holds"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/server"
	"github.com/charonlimit/charon/tiers"
)

// testClock is the engine's injected clock, moved by hand.
type testClock struct{ ns atomic.Int64 }

func (c *testClock) Now() time.Time          { return time.Unix(0, c.ns.Load()).UTC() }
func (c *testClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// downCopies is a copy store that cannot be reached.
type downCopies struct{ copystore.Store }

var errDown = fmt.Errorf("%w: connection refused", copystore.ErrUnavailable)

func (downCopies) Reserve(context.Context, time.Time, string, *copylog.Config, copylog.ReserveRequest) (copylog.Reservation, error) {
	return copylog.Reservation{}, errDown
}

func (downCopies) Release(context.Context, time.Time, string, string, int64) (copylog.ReleaseResult, error) {
	return copylog.ReleaseResult{}, errDown
}

func charonTree(t testing.TB) *descriptors.Tree {
	t.Helper()
	tree, err := descriptors.NewTree([]descriptors.DomainSpec{
		{Config: descriptors.DomainConfig{Name: "c"}, Nodes: []*descriptors.Node{
			{Key: "db", Limit: &descriptors.Limit{Copies: &descriptors.Copies{
				DomainLimit: 3, GlobalLimit: 5,
				Groups: []descriptors.Group{{Name: "team", Limit: 4, Members: []string{"a", "b"}}},
			}}},
			{Key: "big", Limit: &descriptors.Limit{Copies: &descriptors.Copies{DomainLimit: 1 << 40}}},
			{Key: "rate", Limit: &descriptors.Limit{Policy: &tiers.Policy{Kind: tiers.KindTiers,
				Tiers: []tiers.Tier{{Limit: 3, Window: time.Second, Active: tiers.Unbounded}}}}},
			{Key: "fast", Limit: &descriptors.Limit{Policy: &tiers.Policy{Kind: tiers.KindTiers,
				Tiers: []tiers.Tier{{Limit: 1 << 40, Window: time.Second, Active: tiers.Unbounded}}}}},
		}},
		{Config: descriptors.DomainConfig{Name: "open", AllowUnconfigured: true}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return tree
}

type charonFixture struct {
	srv    *server.Server
	svc    *Service
	eng    *engine.Engine
	broker *holds.Broker
	clock  *testClock
	copies *memcopy.Store
	c      charonv1.CharonClient
}

func newCharonFixture(t *testing.T, copts Options, copies copystore.Store) *charonFixture {
	t.Helper()
	f := &charonFixture{}
	if copies == nil {
		f.copies = memcopy.New(memcopy.Options{})
		t.Cleanup(func() { f.copies.Close() })
		copies = f.copies
	}
	f.eng, f.clock = charonEngine(t)
	f.broker = charonBroker(f.eng, f.clock, copies)
	f.svc = New(f.eng, f.broker, copts)
	s, stop := newTestServer(t, f.svc, server.Options{Engine: f.eng})
	t.Cleanup(stop)
	f.srv = s
	f.c = charonv1.NewCharonClient(dial(t, s.GRPCAddr()))
	return f
}

// charonEngine is an engine over a memstore, with charonTree and a test
// clock.
func charonEngine(t *testing.T) (*engine.Engine, *testClock) {
	t.Helper()
	clock := &testClock{}
	clock.ns.Store(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC).UnixNano())
	st := memstore.New(memstore.Options{})
	t.Cleanup(func() { st.Close() })
	eng := engine.New(engine.Options{Store: st, Now: clock.Now})
	eng.SetTree(charonTree(t))
	return eng, clock
}

// charonBroker is the copy operations over copies, on eng's tree and clock.
func charonBroker(eng *engine.Engine, clock *testClock, copies copystore.Store) *holds.Broker {
	return holds.New(holds.Options{Copies: copies, Tree: eng.Tree, Now: clock.Now})
}

func res(domain string, kv ...string) *charonv1.Resource {
	r := &charonv1.Resource{Domain: domain}
	for i := 0; i+1 < len(kv); i += 2 {
		r.Entries = append(r.Entries, &charonv1.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return r
}

// errOf is the error of a call, its response dropped.
func errOf[R any](_ R, err error) error { return err }

func TestCharonUnary(t *testing.T) {
	f := newCharonFixture(t, Options{}, nil)
	ctx := context.Background()

	rq, err := f.c.Request(ctx, &charonv1.RequestRequest{Resource: res("c", "rate", "u"), Copies: 5, MinCopies: 2})
	if err != nil {
		t.Fatal(err)
	}
	if !rq.Ok || rq.Granted != 3 || rq.Target.GetResource() != "c/rate" || rq.Target.GetDomain() != "u" || rq.TierLimit != 3 || rq.Tier != 1 {
		t.Errorf("request: got %v", rq)
	}
	rq, err = f.c.Request(ctx, &charonv1.RequestRequest{Resource: res("c", "rate", "u"), Copies: 1, MinCopies: 1})
	if err != nil || rq.Ok || rq.RetryAfter == nil || rq.RetryAfter.AsDuration() <= 0 {
		t.Errorf("rejected request: got %v, %v; want retry_after", rq, err)
	}
	if rq, err = f.c.Request(ctx, &charonv1.RequestRequest{Resource: res("open", "x", "y"), Copies: 9}); err != nil || !rq.Ok || rq.Granted != 9 {
		t.Errorf("allow_unconfigured request: got %v, %v", rq, err)
	}

	rv, err := f.c.Reserve(ctx, &charonv1.ReserveRequest{Resource: res("c", "db", "a"), Copies: 5, Session: "me"})
	if err != nil {
		t.Fatal(err)
	}
	if !rv.Ok || rv.Granted != 3 || rv.HoldId == "" || !rv.LimitedByDomain || rv.FencingToken != 1 ||
		rv.Context.GetDomainLimit() != 3 || rv.Context.GetGlobalLimit() != 5 || rv.Context.GetDomainHolds() != 3 ||
		len(rv.Context.GetGroups()) != 1 || rv.Context.Groups[0].GetHolds() != 3 ||
		!rv.LeaseExpires.AsTime().Equal(f.clock.Now().Add(DefaultUnaryLease)) {
		t.Errorf("reserve: got %v", rv)
	}
	rj, err := f.c.Reserve(ctx, &charonv1.ReserveRequest{Resource: res("c", "db", "b"), Copies: 2, MinCopies: 2})
	if err != nil || rj.Ok || rj.HoldId != "" || rj.LimitedByGroup != "team" {
		t.Errorf("rejected reserve: got %v, %v", rj, err)
	}
	rl, err := f.c.Release(ctx, &charonv1.ReleaseRequest{HoldId: rv.HoldId, Copies: 1})
	if err != nil || rl.Released != 1 || rl.Remaining != 2 || rl.DomainHolds != 2 || rl.TotalHolds != 2 {
		t.Errorf("release: got %v, %v", rl, err)
	}
	tr, err := f.c.Transfer(ctx, &charonv1.TransferRequest{HoldId: rv.HoldId, Copies: 1, Ttl: durationpb.New(time.Minute)})
	if err != nil || tr.TransferId == "" || tr.Copies != 1 || tr.Remaining != 1 || !tr.Expires.AsTime().Equal(f.clock.Now().Add(time.Minute)) {
		t.Fatalf("transfer: got %v, %v", tr, err)
	}
	sz, err := f.c.Seize(ctx, &charonv1.SeizeRequest{TransferId: tr.TransferId, Lease: durationpb.New(time.Minute)})
	if err != nil || sz.Copies != 1 || sz.HoldId == "" || sz.Target.GetDomain() != "a" || sz.Target.GetResource() != "c/db" ||
		len(sz.Groups) != 1 || len(sz.CurrentGroups) != 1 || sz.FencingToken != 2 {
		t.Errorf("seize: got %v, %v", sz, err)
	}
	ka, err := f.c.KeepAlive(ctx, &charonv1.KeepAliveRequest{Target: &charonv1.KeepAliveRequest_Session{Session: "me"}, Lease: durationpb.New(5 * time.Minute)})
	if err != nil || ka.Holds != 1 || !ka.LeaseExpires.AsTime().Equal(f.clock.Now().Add(5*time.Minute)) {
		t.Errorf("keepalive session: got %v, %v", ka, err)
	}
	ka, err = f.c.KeepAlive(ctx, &charonv1.KeepAliveRequest{Target: &charonv1.KeepAliveRequest_HoldId{HoldId: sz.HoldId}})
	if err != nil || ka.Holds != 1 {
		t.Errorf("keepalive hold: got %v, %v", ka, err)
	}
	m := f.srv.Metrics().Registry
	if n := metricValue(t, f.svc.metrics.reservations.WithLabelValues("c/db", "granted")); n != 1 {
		t.Errorf("granted reservations: %v, want 1", n)
	}
	if n := metricValue(t, f.svc.metrics.reservations.WithLabelValues("c/db", "rejected")); n != 1 {
		t.Errorf("rejected reservations: %v, want 1", n)
	}
	if _, err := m.Gather(); err != nil {
		t.Errorf("gather: %v", err)
	}
}

func TestCharonErrorCodes(t *testing.T) {
	f := newCharonFixture(t, Options{}, nil)
	down := newCharonFixture(t, Options{}, downCopies{})
	ctx := context.Background()
	hold, err := f.c.Reserve(ctx, &charonv1.ReserveRequest{Resource: res("c", "db", "a"), Copies: 3, RequestId: "q1"})
	if err != nil || !hold.Ok {
		t.Fatalf("reserve: %v, %v", hold, err)
	}
	seized, err := f.c.Transfer(ctx, &charonv1.TransferRequest{HoldId: hold.HoldId, Copies: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.c.Seize(ctx, &charonv1.SeizeRequest{TransferId: seized.TransferId}); err != nil {
		t.Fatal(err)
	}
	expired, err := f.c.Transfer(ctx, &charonv1.TransferRequest{HoldId: hold.HoldId, Copies: 1, Ttl: durationpb.New(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(time.Second)
	unknown, _ := holds.NewID("c/db")

	// The calls run in order as the table is built; each is refused and
	// changes nothing.
	for _, tc := range []struct {
		name  string
		err   error
		code  codes.Code
		field string
	}{
		{"request empty domain", errOf(f.c.Request(ctx, &charonv1.RequestRequest{Resource: res("", "rate", "u"), Copies: 1})), codes.InvalidArgument, "resource.domain"},
		{"request zero copies", errOf(f.c.Request(ctx, &charonv1.RequestRequest{Resource: res("c", "rate", "u")})), codes.InvalidArgument, "copies"},
		{"request min above copies", errOf(f.c.Request(ctx, &charonv1.RequestRequest{Resource: res("c", "rate", "u"), Copies: 1, MinCopies: 2})), codes.InvalidArgument, "min_copies"},
		{"request unknown resource", errOf(f.c.Request(ctx, &charonv1.RequestRequest{Resource: res("c", "nope", "u"), Copies: 1})), codes.NotFound, "resource"},
		{"request copy-limited", errOf(f.c.Request(ctx, &charonv1.RequestRequest{Resource: res("c", "db", "a"), Copies: 1})), codes.FailedPrecondition, "resource"},
		{"reserve rate-limited", errOf(f.c.Reserve(ctx, &charonv1.ReserveRequest{Resource: res("c", "rate", "a"), Copies: 1})), codes.FailedPrecondition, "resource"},
		{"reserve unknown resource", errOf(f.c.Reserve(ctx, &charonv1.ReserveRequest{Resource: res("zz", "db", "a"), Copies: 1})), codes.NotFound, "resource"},
		{"reserve empty key", errOf(f.c.Reserve(ctx, &charonv1.ReserveRequest{Resource: res("c", "", "a"), Copies: 1})), codes.InvalidArgument, "resource.entries[0].key"},
		{"reserve zero copies", errOf(f.c.Reserve(ctx, &charonv1.ReserveRequest{Resource: res("c", "db", "a")})), codes.InvalidArgument, "copies"},
		{"reserve negative lease", errOf(f.c.Reserve(ctx, &charonv1.ReserveRequest{Resource: res("c", "db", "a"), Copies: 1, Lease: durationpb.New(-time.Second)})), codes.InvalidArgument, "lease"},
		{"reserve lease above max", errOf(f.c.Reserve(ctx, &charonv1.ReserveRequest{Resource: res("c", "db", "a"), Copies: 1, Lease: durationpb.New(time.Hour)})), codes.InvalidArgument, "lease"},
		{"reserve request id of another domain", errOf(f.c.Reserve(ctx, &charonv1.ReserveRequest{Resource: res("c", "db", "b"), Copies: 1, RequestId: "q1"})), codes.AlreadyExists, "request_id"},
		{"reserve store down", errOf(down.c.Reserve(ctx, &charonv1.ReserveRequest{Resource: res("c", "db", "a"), Copies: 1})), codes.Unavailable, ""},
		{"release over", errOf(f.c.Release(ctx, &charonv1.ReleaseRequest{HoldId: hold.HoldId, Copies: 5})), codes.OutOfRange, "copies"},
		{"release unknown", errOf(f.c.Release(ctx, &charonv1.ReleaseRequest{HoldId: unknown})), codes.NotFound, "hold_id"},
		{"release malformed", errOf(f.c.Release(ctx, &charonv1.ReleaseRequest{HoldId: "not-an-id"})), codes.NotFound, "hold_id"},
		{"release empty", errOf(f.c.Release(ctx, &charonv1.ReleaseRequest{})), codes.InvalidArgument, "hold_id"},
		{"release negative", errOf(f.c.Release(ctx, &charonv1.ReleaseRequest{HoldId: hold.HoldId, Copies: -1})), codes.InvalidArgument, "copies"},
		{"release store down", errOf(down.c.Release(ctx, &charonv1.ReleaseRequest{HoldId: hold.HoldId})), codes.Unavailable, ""},
		{"transfer over", errOf(f.c.Transfer(ctx, &charonv1.TransferRequest{HoldId: hold.HoldId, Copies: 5})), codes.OutOfRange, "copies"},
		{"transfer unknown", errOf(f.c.Transfer(ctx, &charonv1.TransferRequest{HoldId: unknown})), codes.NotFound, "hold_id"},
		{"transfer zero ttl", errOf(f.c.Transfer(ctx, &charonv1.TransferRequest{HoldId: hold.HoldId, Ttl: durationpb.New(0)})), codes.InvalidArgument, "ttl"},
		{"seize unknown", errOf(f.c.Seize(ctx, &charonv1.SeizeRequest{TransferId: unknown})), codes.NotFound, "transfer_id"},
		{"seize seized", errOf(f.c.Seize(ctx, &charonv1.SeizeRequest{TransferId: seized.TransferId})), codes.NotFound, "transfer_id"},
		{"seize expired", errOf(f.c.Seize(ctx, &charonv1.SeizeRequest{TransferId: expired.TransferId})), codes.NotFound, "transfer_id"},
		{"keepalive no target", errOf(f.c.KeepAlive(ctx, &charonv1.KeepAliveRequest{})), codes.InvalidArgument, "target"},
		{"keepalive empty session", errOf(f.c.KeepAlive(ctx, &charonv1.KeepAliveRequest{Target: &charonv1.KeepAliveRequest_Session{}})), codes.InvalidArgument, "session"},
		{"keepalive unknown hold", errOf(f.c.KeepAlive(ctx, &charonv1.KeepAliveRequest{Target: &charonv1.KeepAliveRequest_HoldId{HoldId: unknown}})), codes.NotFound, "hold_id"},
	} {
		if got := status.Code(tc.err); got != tc.code {
			t.Errorf("%s: got %v, want code %v", tc.name, tc.err, tc.code)
			continue
		}
		if msg := status.Convert(tc.err).Message(); tc.field != "" && !strings.HasPrefix(msg, tc.field+":") {
			t.Errorf("%s: message %q does not begin with field %q", tc.name, msg, tc.field)
		}
	}
}

func TestUnaryLeaseLapses(t *testing.T) {
	f := newCharonFixture(t, Options{}, nil)
	ctx := context.Background()
	reserve := func(copies int64) *charonv1.ReserveResponse {
		t.Helper()
		r, err := f.c.Reserve(ctx, &charonv1.ReserveRequest{Resource: res("c", "db", "a"), Copies: copies, Lease: durationpb.New(10 * time.Second)})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	h := reserve(3)
	f.clock.Advance(9 * time.Second)
	if _, err := f.c.KeepAlive(ctx, &charonv1.KeepAliveRequest{Target: &charonv1.KeepAliveRequest_HoldId{HoldId: h.HoldId}, Lease: durationpb.New(10 * time.Second)}); err != nil {
		t.Fatalf("keepalive: %v", err)
	}
	f.clock.Advance(9 * time.Second)
	if r := reserve(1); r.Ok {
		t.Errorf("reserve while the kept-alive hold lives: granted %v", r)
	}
	f.clock.Advance(time.Second)
	if r := reserve(3); !r.Ok || r.Granted != 3 {
		t.Errorf("reserve after the lease lapsed: got %v, want 3 granted", r)
	}
	if _, err := f.c.Release(ctx, &charonv1.ReleaseRequest{HoldId: h.HoldId}); status.Code(err) != codes.NotFound {
		t.Errorf("release of the lapsed hold: got %v, want NotFound", err)
	}
	if n := metricValue(t, f.svc.metrics.leaseExpiries); n != 1 {
		t.Errorf("lease expiries: %v, want 1", n)
	}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestSessionStream(t *testing.T) {
	f := newCharonFixture(t, Options{}, nil)
	ctx := context.Background()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := f.c.Session(sctx)
	if err != nil {
		t.Fatal(err)
	}
	send := func(req *charonv1.SessionRequest) *charonv1.SessionResponse {
		t.Helper()
		if err := st.Send(req); err != nil {
			t.Fatal(err)
		}
		resp, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if resp.Id != req.Id {
			t.Errorf("correlation id %d, want %d", resp.Id, req.Id)
		}
		return resp
	}
	r := send(&charonv1.SessionRequest{Id: 7, Operation: &charonv1.SessionRequest_Reserve{Reserve: &charonv1.ReserveRequest{Resource: res("c", "db", "a"), Copies: 3}}})
	hold := r.GetReserve()
	if !hold.GetOk() || hold.Granted != 3 || !hold.LeaseExpires.AsTime().Equal(f.clock.Now().Add(DefaultSessionLease)) {
		t.Fatalf("reserve on the stream: got %v", r)
	}
	r = send(&charonv1.SessionRequest{Id: 8, Operation: &charonv1.SessionRequest_Release{Release: &charonv1.ReleaseRequest{HoldId: "nope"}}})
	if e := r.GetError(); e == nil || codes.Code(e.Code) != codes.NotFound || !strings.HasPrefix(e.Message, "hold_id:") {
		t.Errorf("error on the stream: got %v", r)
	}
	r = send(&charonv1.SessionRequest{Id: 9, Operation: &charonv1.SessionRequest_KeepAlive{KeepAlive: &charonv1.KeepAliveRequest{}}})
	if r.GetKeepAlive().GetHolds() != 1 {
		t.Errorf("stream keepalive: got %v", r)
	}
	r = send(&charonv1.SessionRequest{Id: 10, Operation: &charonv1.SessionRequest_Request{Request: &charonv1.RequestRequest{Resource: res("c", "rate", "u"), Copies: 1}}})
	if !r.GetRequest().GetOk() {
		t.Errorf("request on the stream: got %v", r)
	}
	r = send(&charonv1.SessionRequest{Id: 11})
	if e := r.GetError(); e == nil || codes.Code(e.Code) != codes.InvalidArgument {
		t.Errorf("no operation: got %v", r)
	}
	// Transfer out of the stream's hold, seize on the stream: both copies
	// belong to the session.
	r = send(&charonv1.SessionRequest{Id: 12, Operation: &charonv1.SessionRequest_Transfer{Transfer: &charonv1.TransferRequest{HoldId: hold.HoldId, Copies: 1}}})
	r = send(&charonv1.SessionRequest{Id: 13, Operation: &charonv1.SessionRequest_Seize{Seize: &charonv1.SeizeRequest{TransferId: r.GetTransfer().GetTransferId()}}})
	if r.GetSeize().GetCopies() != 1 {
		t.Errorf("seize on the stream: got %v", r)
	}

	other, err := f.c.Reserve(ctx, &charonv1.ReserveRequest{Resource: res("c", "db", "a"), Copies: 1})
	if err != nil || other.Ok {
		t.Fatalf("reserve while the stream holds every copy: %v, %v", other, err)
	}
	cancel() // the client goes away
	waitFor(t, "the stream's copies to be released", func() bool {
		r, err := f.c.Reserve(ctx, &charonv1.ReserveRequest{Resource: res("c", "db", "a"), Copies: 3, MinCopies: 3})
		if err != nil {
			t.Fatal(err)
		}
		if r.Ok {
			f.c.Release(ctx, &charonv1.ReleaseRequest{HoldId: r.HoldId})
		}
		return r.Ok
	})
	waitFor(t, "the session metrics", func() bool {
		return metricValue(t, f.svc.metrics.sessionReleased) == 2 && metricValue(t, f.svc.metrics.sessions) == 0
	})
}

func TestSessionCloseSendReleases(t *testing.T) {
	f := newCharonFixture(t, Options{}, nil)
	ctx := context.Background()
	st, err := f.c.Session(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&charonv1.SessionRequest{Id: 1, Operation: &charonv1.SessionRequest_Reserve{Reserve: &charonv1.ReserveRequest{Resource: res("c", "db", "a"), Copies: 3}}}); err != nil {
		t.Fatal(err)
	}
	if r, err := st.Recv(); err != nil || !r.GetReserve().GetOk() {
		t.Fatalf("reserve: %v, %v", r, err)
	}
	st.CloseSend()
	if _, err := st.Recv(); err == nil {
		t.Fatal("stream still open after CloseSend")
	}
	// The handler released the holds before ending the stream.
	if s := f.copies.Stats(); s.Copies != 0 || s.SessionHolds != 1 {
		t.Errorf("after the stream ended: %+v", s)
	}
}

// renewals records the clock each stream renewal of a broker started at.
type renewals struct {
	*holds.Broker
	clock *testClock
	mu    sync.Mutex
	last  time.Time
}

func (r *renewals) KeepAliveSession(ctx context.Context, session string, lease time.Duration, resources []string) (copylog.KeepAliveResult, error) {
	at := r.clock.Now() // the broker reads it again: at is a lower bound
	res, err := r.Broker.KeepAliveSession(ctx, session, lease, resources)
	r.mu.Lock()
	r.last = at
	r.mu.Unlock()
	return res, err
}

func (r *renewals) renewedAt(t time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.last.Before(t)
}

func TestSessionRenewsLeases(t *testing.T) {
	lease := 30 * time.Millisecond
	f := newCharonFixture(t, Options{SessionLease: lease}, nil)
	rn := &renewals{Broker: f.broker, clock: f.clock}
	f.svc.holds = rn // before any stream: no call is in flight
	st, err := f.c.Session(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer st.CloseSend()
	if err := st.Send(&charonv1.SessionRequest{Id: 1, Operation: &charonv1.SessionRequest_Reserve{Reserve: &charonv1.ReserveRequest{Resource: res("c", "db", "a"), Copies: 3}}}); err != nil {
		t.Fatal(err)
	}
	if r, err := st.Recv(); err != nil || !r.GetReserve().GetOk() {
		t.Fatalf("reserve: %v, %v", r, err)
	}
	// Five times two thirds of a lease: the hold outlives its first lease
	// because each renewal extends it from the engine's now.
	for i := 0; i < 5; i++ {
		f.clock.Advance(lease * 2 / 3)
		now := f.clock.Now()
		waitFor(t, "a renewal", func() bool { return rn.renewedAt(now) })
	}
	if s := f.copies.Stats(); s.Holds != 1 || s.Copies != 3 {
		t.Errorf("after renewals: %+v, want the hold alive", s)
	}
}

func TestShutdownEndsSessions(t *testing.T) {
	copies := memcopy.New(memcopy.Options{})
	defer copies.Close()
	eng, clock := charonEngine(t)
	// A session holding up shutdown would take the whole ShutdownTimeout.
	s, stop := newTestServer(t, New(eng, charonBroker(eng, clock, copies), Options{}), server.Options{Engine: eng, ShutdownTimeout: 2 * time.Minute})
	c := charonv1.NewCharonClient(dial(t, s.GRPCAddr()))
	st, err := c.Session(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	st.Send(&charonv1.SessionRequest{Id: 1, Operation: &charonv1.SessionRequest_Reserve{Reserve: &charonv1.ReserveRequest{Resource: res("c", "db", "a"), Copies: 3}}})
	if r, err := st.Recv(); err != nil || !r.GetReserve().GetOk() {
		t.Fatalf("reserve: %v, %v", r, err)
	}
	start := time.Now()
	stop()
	if d := time.Since(start); d > time.Minute {
		t.Errorf("shutdown took %v: the session held it up", d)
	}
	if _, err := st.Recv(); status.Code(err) != codes.Unavailable {
		t.Errorf("stream after shutdown: %v, want Unavailable", err)
	}
	if s := copies.Stats(); s.Copies != 0 {
		t.Errorf("copies held after shutdown: %+v", s)
	}
}

// metricValue reads a counter or a gauge.
func metricValue(t *testing.T, c prometheus.Metric) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	if g := m.GetGauge(); g != nil {
		return g.GetValue()
	}
	return m.GetCounter().GetValue()
}
