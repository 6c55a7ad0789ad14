package charon

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
	"github.com/charonlimit/charon/copylog"
	"github.com/charonlimit/charon/internal/holds"
)

// flakyRenewals is a broker whose stream renewals fail while fail is set;
// it counts the renewals asked of it.
type flakyRenewals struct {
	*holds.Broker
	fail  atomic.Bool
	calls atomic.Int64
}

func (r *flakyRenewals) KeepAliveSession(ctx context.Context, session string, lease time.Duration, resources []string) (copylog.KeepAliveResult, error) {
	r.calls.Add(1)
	if r.fail.Load() {
		return copylog.KeepAliveResult{}, errDown
	}
	return r.Broker.KeepAliveSession(ctx, session, lease, resources)
}

// reserveOn reserves copies of c/db for domain a on the stream.
func reserveOn(t *testing.T, st charonv1.Charon_SessionClient, id uint64, copies int64) {
	t.Helper()
	if err := st.Send(&charonv1.SessionRequest{Id: id, Operation: &charonv1.SessionRequest_Reserve{Reserve: &charonv1.ReserveRequest{Resource: res("c", "db", "a"), Copies: copies}}}); err != nil {
		t.Fatal(err)
	}
	if r, err := st.Recv(); err != nil || !r.GetReserve().GetOk() {
		t.Fatalf("reserve on the stream: %v, %v", r, err)
	}
}

// renewalStream opens a Session stream, with a lease of lease, on a server
// whose renewals fail when rn.fail is set (fail: from the start), and
// reserves 3 copies on it. The stream has a generous deadline (20 s).
func renewalStream(t *testing.T, lease time.Duration, fail bool) (*charonFixture, *flakyRenewals, charonv1.Charon_SessionClient) {
	t.Helper()
	f := newCharonFixture(t, Options{SessionLease: lease}, nil)
	rn := &flakyRenewals{Broker: f.broker}
	rn.fail.Store(fail)
	f.svc.holds = rn // before any stream: no call is in flight
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	st, err := f.c.Session(ctx)
	if err != nil {
		t.Fatal(err)
	}
	reserveOn(t, st, 1, 3)
	return f, rn, st
}

// TestSessionEndsWhenRenewalsFail: a stream whose holds can no longer be
// renewed ends with UNAVAILABLE before they lapse, releasing what it can,
// instead of staying open while the store grants its copies to others.
func TestSessionEndsWhenRenewalsFail(t *testing.T) {
	// The stream should end about two thirds of a lease after the reserve;
	// a stream that never ends meets renewalStream's deadline instead.
	f, rn, st := renewalStream(t, 300*time.Millisecond, true)
	r, err := st.Recv()
	if code := status.Code(err); code != codes.Unavailable {
		t.Fatalf("stream whose renewals fail: got %v, %v, want code Unavailable", r, err)
	}
	if msg := status.Convert(err).Message(); !strings.Contains(msg, "session lease could not be renewed") {
		t.Errorf("message %q does not say the session lease could not be renewed", msg)
	}
	if n := rn.calls.Load(); n < 1 {
		t.Errorf("renewals tried: %d, want at least 1", n)
	}
	// The handler released the holds (the store answers releases) before
	// ending the stream.
	if s := f.copies.Stats(); s.Copies != 0 {
		t.Errorf("after the stream ended: %+v, want no copies held", s)
	}
}

// TestSessionOutlivesLeasesWhileRenewed: a stream whose renewals succeed
// lives on, and answers, long after its first lease would have ended; once
// they fail it ends.
func TestSessionOutlivesLeasesWhileRenewed(t *testing.T) {
	_, rn, st := renewalStream(t, 30*time.Millisecond, false)
	// Twelve renewals: four leases at least.
	waitFor(t, "twelve renewals", func() bool { return rn.calls.Load() >= 12 })
	if err := st.Send(&charonv1.SessionRequest{Id: 2, Operation: &charonv1.SessionRequest_KeepAlive{KeepAlive: &charonv1.KeepAliveRequest{}}}); err != nil {
		t.Fatal(err)
	}
	if r, err := st.Recv(); err != nil || r.GetKeepAlive().GetHolds() != 1 {
		t.Fatalf("keepalive after four leases: got %v, %v, want 1 hold", r, err)
	}
	rn.fail.Store(true)
	if r, err := st.Recv(); status.Code(err) != codes.Unavailable {
		t.Errorf("once renewals fail: got %v, %v, want code Unavailable", r, err)
	}
}

// TestSessionRenewedAt steps a session's renewal time over fixed instants:
// only its first hold and successful renewals move it.
func TestSessionRenewedAt(t *testing.T) {
	const lease = 9 * time.Second
	t0 := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	s := &session{id: "s:x"}
	for i, step := range []struct {
		touch   string // resource an operation reached ("": none)
		at      time.Duration
		renewed time.Duration // -1: zero
		lapsing bool          // of a renewal failing at at
	}{
		{"", 0, -1, false},
		{"", lease, -1, false}, // no hold: nothing to lose
		{"c/db", time.Second, time.Second, false},
		{"", time.Second + lease/2 - 1, time.Second, false},
		{"", time.Second + lease/2, time.Second, true},
		{"c/other", time.Second + lease/2, time.Second, true}, // a later reserve renews only its own hold
		{"c/db", time.Second + lease, time.Second, true},
	} {
		now := t0.Add(step.at)
		s.touch(step.touch, now)
		want := time.Time{}
		if step.renewed >= 0 {
			want = t0.Add(step.renewed)
		}
		if !s.renewed.Equal(want) {
			t.Errorf("step %d: renewed %v, want %v", i, s.renewed, want)
		}
		if got := s.lapsing(now, lease); got != step.lapsing {
			t.Errorf("step %d: lapsing at %v: got %v, want %v", i, step.at, got, step.lapsing)
		}
	}
}

// TestSessionRenewalMovesRenewed: a failed renewal leaves the session's
// renewal time; a successful one, from the timer or a KeepAlive without a
// target on the stream, sets it to when it began.
func TestSessionRenewalMovesRenewed(t *testing.T) {
	f := newCharonFixture(t, Options{}, nil)
	rn := &flakyRenewals{Broker: f.broker}
	c := f.svc
	c.holds = rn // no stream runs: no call is in flight
	ctx := context.Background()
	long := time.Now().Add(-time.Hour)
	keepAlive := func(s *session) error {
		r := c.sessionOp(ctx, s, &charonv1.SessionRequest{Id: 1, Operation: &charonv1.SessionRequest_KeepAlive{KeepAlive: &charonv1.KeepAliveRequest{}}})
		if e := r.GetError(); e != nil {
			return status.Error(codes.Code(e.Code), e.Message)
		}
		return nil
	}
	renew := func(s *session) error { _, err := c.renew(ctx, s); return err }
	for _, tc := range []struct {
		name  string
		renew func(*session) error
	}{
		{"timer", renew},
		{"keepalive", keepAlive},
	} {
		s := &session{id: "s:" + tc.name}
		s.touch("c/db", long)
		rn.fail.Store(true)
		if err := tc.renew(s); err == nil {
			t.Errorf("%s: failing renewal: got no error", tc.name)
		}
		if !s.renewed.Equal(long) {
			t.Errorf("%s: after a failed renewal: renewed %v, want %v", tc.name, s.renewed, long)
		}
		rn.fail.Store(false)
		before := time.Now()
		if err := tc.renew(s); err != nil {
			t.Errorf("%s: renewal: %v", tc.name, err)
		}
		if after := time.Now(); s.renewed.Before(before) || s.renewed.After(after) {
			t.Errorf("%s: after a renewal: renewed %v, want in [%v, %v]", tc.name, s.renewed, before, after)
		}
	}
}

// TestCharonDurationBounds: a lease or ttl outside [1µs, MaxLease] is
// refused with INVALID_ARGUMENT naming its own field and the server's
// bounds, not the copy store's.
func TestCharonDurationBounds(t *testing.T) {
	f := newCharonFixture(t, Options{}, nil)
	ctx := context.Background()
	hold, err := f.c.Reserve(ctx, &charonv1.ReserveRequest{Resource: res("c", "big", "a"), Copies: 1000})
	if err != nil || !hold.Ok {
		t.Fatalf("reserve: %v, %v", hold, err)
	}
	for _, call := range []struct {
		name, field string
		f           func(d *durationpb.Duration) error
	}{
		{"reserve", "lease", func(d *durationpb.Duration) error {
			return errOf(f.c.Reserve(ctx, &charonv1.ReserveRequest{Resource: res("c", "big", "a"), Copies: 1, Lease: d}))
		}},
		{"transfer", "ttl", func(d *durationpb.Duration) error {
			return errOf(f.c.Transfer(ctx, &charonv1.TransferRequest{HoldId: hold.HoldId, Copies: 1, Ttl: d}))
		}},
		{"seize", "lease", func(d *durationpb.Duration) error {
			tr, err := f.c.Transfer(ctx, &charonv1.TransferRequest{HoldId: hold.HoldId, Copies: 1})
			if err != nil {
				return err
			}
			return errOf(f.c.Seize(ctx, &charonv1.SeizeRequest{TransferId: tr.TransferId, Lease: d}))
		}},
		{"keepalive", "lease", func(d *durationpb.Duration) error {
			return errOf(f.c.KeepAlive(ctx, &charonv1.KeepAliveRequest{Target: &charonv1.KeepAliveRequest_HoldId{HoldId: hold.HoldId}, Lease: d}))
		}},
	} {
		for _, tc := range []struct {
			d  time.Duration
			ok bool
		}{
			{0, false},
			{500 * time.Nanosecond, false},
			{time.Microsecond - 1, false},
			{time.Microsecond, true},
			{DefaultMaxLease, true},
			{DefaultMaxLease + time.Microsecond, false},
		} {
			err := call.f(durationpb.New(tc.d))
			if tc.ok {
				if err != nil {
					t.Errorf("%s %s %v: got %v, want no error", call.name, call.field, tc.d, err)
				}
				continue
			}
			msg := status.Convert(err).Message()
			if code := status.Code(err); code != codes.InvalidArgument || !strings.HasPrefix(msg, call.field+":") || !strings.Contains(msg, DefaultMaxLease.String()) {
				t.Errorf("%s %s %v: got %v, want InvalidArgument naming %q and the bound %v", call.name, call.field, tc.d, err, call.field, DefaultMaxLease)
			}
		}
	}
}
