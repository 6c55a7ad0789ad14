package holds

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/charonlimit/charon/copylog"
	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/copystore"
	"github.com/charonlimit/charon/tiers"
)

// fakeCopies is a copystore.Store over copylog states in a map; err, when
// set, fails every operation as an unreachable store would.
type fakeCopies struct {
	mu     sync.Mutex
	states map[string]*copylog.State
	err    error
}

// apply applies op, one of the store's operations, to resource's state.
func apply[R any](f *fakeCopies, resource string, op func(s *copylog.State) (R, error)) (R, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		var zero R
		return zero, fmt.Errorf("%w: %w", copystore.ErrUnavailable, f.err)
	}
	if f.states == nil {
		f.states = make(map[string]*copylog.State)
	}
	s := f.states[resource]
	if s == nil {
		s = new(copylog.State)
		f.states[resource] = s
	}
	return op(s)
}

func (f *fakeCopies) Reserve(_ context.Context, now time.Time, resource string, cfg *copylog.Config, r copylog.ReserveRequest) (copylog.Reservation, error) {
	return apply(f, resource, func(s *copylog.State) (copylog.Reservation, error) { return copylog.Reserve(cfg, s, now, r) })
}

func (f *fakeCopies) Release(_ context.Context, now time.Time, resource, holdID string, copies int64) (copylog.ReleaseResult, error) {
	return apply(f, resource, func(s *copylog.State) (copylog.ReleaseResult, error) { return copylog.Release(s, now, holdID, copies) })
}

func (f *fakeCopies) Transfer(_ context.Context, now time.Time, resource, holdID string, copies int64, ttl time.Duration, transferID string) (copylog.TransferResult, error) {
	return apply(f, resource, func(s *copylog.State) (copylog.TransferResult, error) {
		return copylog.Transfer(s, now, holdID, copies, ttl, transferID)
	})
}

func (f *fakeCopies) Seize(_ context.Context, now time.Time, resource, transferID, holdID, session string, lease time.Duration) (copylog.SeizeResult, error) {
	return apply(f, resource, func(s *copylog.State) (copylog.SeizeResult, error) {
		return copylog.Seize(s, now, transferID, holdID, session, lease)
	})
}

func (f *fakeCopies) KeepAlive(_ context.Context, now time.Time, resource, session, holdID string, lease time.Duration) (copylog.KeepAliveResult, error) {
	return apply(f, resource, func(s *copylog.State) (copylog.KeepAliveResult, error) {
		return copylog.KeepAlive(s, now, session, holdID, lease)
	})
}

func (f *fakeCopies) ReleaseSession(_ context.Context, now time.Time, resource, session string) (copylog.SessionResult, error) {
	return apply(f, resource, func(s *copylog.State) (copylog.SessionResult, error) { return copylog.ReleaseSession(s, now, session) })
}

func (f *fakeCopies) Reap(context.Context, time.Time) error { return nil }
func (f *fakeCopies) Close() error                          { return nil }

// holdTree has a copy-limited resource with a group, a rate-limited one, an
// unlimited one, and a domain allowing unconfigured resources.
func holdTree(t *testing.T) *descriptors.Tree {
	t.Helper()
	rate := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 3, Window: time.Second, Active: tiers.Unbounded}}}
	tree, err := descriptors.NewTree([]descriptors.DomainSpec{
		{Config: descriptors.DomainConfig{Name: "c"}, Nodes: []*descriptors.Node{
			{Key: "db", Limit: &descriptors.Limit{Copies: &descriptors.Copies{
				DomainLimit: 3, GlobalLimit: 5,
				Groups: []descriptors.Group{{Name: "team", Limit: 4, Members: []string{"a", "b"}}},
			}}},
			{Key: "rate", Limit: &descriptors.Limit{Policy: rate}},
			{Key: "free", Limit: &descriptors.Limit{Unlimited: true}},
		}},
		{Config: descriptors.DomainConfig{Name: "open", AllowUnconfigured: true}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return tree
}

// entry is the entries of a one-entry descriptor.
func entry(key, value string) []descriptors.Entry {
	return []descriptors.Entry{{Key: key, Value: value}}
}

// newBroker returns a Broker over holdTree and a fake copy store, and the
// instant its clock reads (a test moves it).
func newBroker(t *testing.T) (*Broker, *fakeCopies, *time.Time) {
	t.Helper()
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	fc := &fakeCopies{}
	tree := holdTree(t)
	b := New(Options{Copies: fc, Now: func() time.Time { return now }, Tree: func() *descriptors.Tree { return tree }})
	return b, fc, &now
}

// wantFieldError checks that err is an error matching want (when not nil)
// and naming field (when not empty) in a *descriptors.InputError or an
// *descriptors.FieldError.
func wantFieldError(t *testing.T, name string, err, want error, field string) {
	t.Helper()
	var in *descriptors.InputError
	var fe *descriptors.FieldError
	got := ""
	switch {
	case err == nil:
		t.Errorf("%s: no error", name)
		return
	case errors.As(err, &in):
		got = in.Field
	case errors.As(err, &fe):
		got = fe.Field
	}
	if want != nil && !errors.Is(err, want) {
		t.Errorf("%s: got %v, want %v", name, err, want)
	}
	if field != "" && got != field {
		t.Errorf("%s: error %q names field %q, want %q", name, err, got, field)
	}
}

func TestReserveReleaseTransferSeize(t *testing.T) {
	e, fc, now := newBroker(t)
	ctx := context.Background()
	res, err := e.Reserve(ctx, ReserveRequest{Domain: "c", Entries: entry("db", "a"), Copies: 5, Min: 1, Lease: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if !res.OK || res.Granted != 3 || !res.LimitedByDomain || res.Resource != "c/db" || res.Domain != "a" {
		t.Fatalf("reserve: got %+v", res)
	}
	if r, _ := ResourceOf(res.HoldID); r != "c/db" {
		t.Errorf("hold id names %q, want c/db", r)
	}
	if diff := cmp.Diff([]string{"team"}, res.Groups); diff != "" {
		t.Errorf("groups (-want +got):\n%s", diff)
	}
	rej, err := e.Reserve(ctx, ReserveRequest{Domain: "c", Entries: entry("db", "b"), Copies: 2, Min: 2, Lease: time.Second})
	if err != nil || rej.OK || rej.LimitedByGroup != "team" {
		t.Errorf("group-limited reserve: got %+v, %v", rej, err)
	}
	rel, err := e.Release(ctx, res.HoldID, 1)
	if err != nil || rel.Released != 1 || rel.Left != 2 {
		t.Errorf("release: got %+v, %v", rel, err)
	}
	tr, err := e.Transfer(ctx, res.HoldID, 2, time.Minute)
	if err != nil || tr.Copies != 2 || tr.Left != 0 {
		t.Fatalf("transfer: got %+v, %v", tr, err)
	}
	if r, _ := ResourceOf(tr.TransferID); r != "c/db" {
		t.Errorf("transfer id names %q", r)
	}
	sz, err := e.Seize(ctx, tr.TransferID, "s1", 5*time.Second)
	if err != nil || sz.Copies != 2 || sz.Domain != "a" || sz.Resource != "c/db" {
		t.Fatalf("seize: got %+v, %v", sz, err)
	}
	if diff := cmp.Diff([]string{"team"}, sz.CurrentGroups); diff != "" {
		t.Errorf("current groups (-want +got):\n%s", diff)
	}
	if _, err := e.Seize(ctx, tr.TransferID, "s1", time.Second); !errors.Is(err, copylog.ErrUnknownTransfer) {
		t.Errorf("second seize: got %v, want ErrUnknownTransfer", err)
	}
	ka, err := e.KeepAliveSession(ctx, "s1", 20*time.Second, nil)
	if err != nil || ka.Holds != 1 || !ka.Expires.Equal(now.Add(20*time.Second)) {
		t.Errorf("keepalive session: got %+v, %v", ka, err)
	}
	ka, err = e.KeepAlive(ctx, sz.HoldID, 30*time.Second)
	if err != nil || ka.Holds != 1 {
		t.Errorf("keepalive hold: got %+v, %v", ka, err)
	}
	sr, err := e.ReleaseSession(ctx, "c/db", "s1")
	if err != nil || sr.Holds != 1 || sr.Copies != 2 {
		t.Errorf("release session: got %+v, %v", sr, err)
	}
	if n := fc.states["c/db"].TotalHeld(); n != 0 {
		t.Errorf("%d copies still held", n)
	}
}

func TestReserveLeaseLapses(t *testing.T) {
	e, _, now := newBroker(t)
	ctx := context.Background()
	res, err := e.Reserve(ctx, ReserveRequest{Domain: "c", Entries: entry("db", "a"), Copies: 3, Lease: 10 * time.Second})
	if err != nil || !res.OK {
		t.Fatalf("reserve: %+v, %v", res, err)
	}
	*now = now.Add(10 * time.Second)
	if _, err := e.Release(ctx, res.HoldID, 0); !errors.Is(err, copylog.ErrUnknownHold) {
		t.Errorf("release after the lease: got %v, want ErrUnknownHold", err)
	}
	again, err := e.Reserve(ctx, ReserveRequest{Domain: "c", Entries: entry("db", "a"), Copies: 3, Lease: time.Second})
	if err != nil || again.Granted != 3 {
		t.Errorf("reserve after the lapse: got %+v, %v", again, err)
	}
}

func TestUnconfiguredReserve(t *testing.T) {
	e, _, _ := newBroker(t)
	ctx := context.Background()
	res, err := e.Reserve(ctx, ReserveRequest{Domain: "open", Entries: entry("x", "y"), Copies: 1000, Lease: time.Second})
	if err != nil || !res.OK || res.Granted != 1000 || res.Resource != "open"+unconfiguredSuffix {
		t.Fatalf("unconfigured reserve: %+v, %v", res, err)
	}
	if _, err := e.Release(ctx, res.HoldID, 0); err != nil {
		t.Errorf("release: %v", err)
	}
	if diff := cmp.Diff([]string{"c/db", "open" + unconfiguredSuffix}, e.CopyResources()); diff != "" {
		t.Errorf("CopyResources (-want +got):\n%s", diff)
	}
}

func TestCopyErrors(t *testing.T) {
	e, fc, _ := newBroker(t)
	ctx := context.Background()
	res, err := e.Reserve(ctx, ReserveRequest{Domain: "c", Entries: entry("db", "a"), Copies: 2, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	unknownHold, _ := NewID("c/db")
	noStore := New(Options{})
	// reserve reserves copies of c's key for domain a.
	reserve := func(key string, copies int64, lease time.Duration) func() error {
		return func() error {
			_, err := e.Reserve(ctx, ReserveRequest{Domain: "c", Entries: entry(key, "a"), Copies: copies, Lease: lease})
			return err
		}
	}
	for _, tc := range []struct {
		name  string
		f     func() error
		want  error
		field string
	}{
		{"reserve rate-limited", reserve("rate", 1, time.Second), ErrRateLimited, "resource"},
		{"reserve unlimited", reserve("free", 1, time.Second), ErrRateLimited, "resource"},
		{"reserve unknown", reserve("nope", 1, time.Second), descriptors.ErrUnknownResource, "resource"},
		{"reserve zero copies", reserve("db", 0, time.Second), nil, "copies"},
		{"reserve no lease", reserve("db", 1, 0), nil, "lease"},
		{"release over", func() error { _, err := e.Release(ctx, res.HoldID, 3); return err }, copylog.ErrOverRelease, "copies"},
		{"release unknown", func() error { _, err := e.Release(ctx, unknownHold, 1); return err }, copylog.ErrUnknownHold, "hold_id"},
		{"release malformed", func() error { _, err := e.Release(ctx, "garbage", 1); return err }, copylog.ErrUnknownHold, "hold_id"},
		{"release empty", func() error { _, err := e.Release(ctx, "", 1); return err }, nil, "hold_id"},
		{"transfer over", func() error { _, err := e.Transfer(ctx, res.HoldID, 3, time.Second); return err }, copylog.ErrOverTransfer, "copies"},
		{"transfer unknown", func() error { _, err := e.Transfer(ctx, unknownHold, 1, time.Second); return err }, copylog.ErrUnknownHold, "hold_id"},
		{"transfer no ttl", func() error { _, err := e.Transfer(ctx, res.HoldID, 1, 0); return err }, nil, "ttl"},
		{"seize unknown", func() error { _, err := e.Seize(ctx, unknownHold, "", time.Second); return err }, copylog.ErrUnknownTransfer, "transfer_id"},
		{"keepalive unknown", func() error { _, err := e.KeepAlive(ctx, unknownHold, time.Second); return err }, copylog.ErrUnknownHold, "hold_id"},
		{"no copy store", func() error { _, err := noStore.Release(ctx, res.HoldID, 1); return err }, ErrNoCopyStore, ""},
		{"store down", func() error {
			fc.err = errors.New("connection refused")
			defer func() { fc.err = nil }()
			_, err := e.Release(ctx, res.HoldID, 1)
			return err
		}, copystore.ErrUnavailable, ""},
	} {
		wantFieldError(t, tc.name, tc.f(), tc.want, tc.field)
	}
}

// TestLeaseBounds: a lease or ttl outside [MinLease, copylog.MaxLease] is an
// *InputError naming its own field; copylog would refuse one under a
// microsecond as a "lease" whatever the field.
func TestLeaseBounds(t *testing.T) {
	ctx := context.Background()
	for _, op := range []struct {
		name, field string
		f           func(e *Broker, holdID, transferID string, d time.Duration) error
	}{
		{"reserve", "lease", func(e *Broker, _, _ string, d time.Duration) error {
			_, err := e.Reserve(ctx, ReserveRequest{Domain: "c", Entries: entry("db", "b"), Copies: 1, Lease: d})
			return err
		}},
		{"transfer", "ttl", func(e *Broker, holdID, _ string, d time.Duration) error {
			_, err := e.Transfer(ctx, holdID, 1, d)
			return err
		}},
		{"seize", "lease", func(e *Broker, _, transferID string, d time.Duration) error {
			_, err := e.Seize(ctx, transferID, "s", d)
			return err
		}},
		{"keepalive", "lease", func(e *Broker, holdID, _ string, d time.Duration) error {
			_, err := e.KeepAlive(ctx, holdID, d)
			return err
		}},
		{"keepalive session", "lease", func(e *Broker, _, _ string, d time.Duration) error {
			_, err := e.KeepAliveSession(ctx, "s", d, nil)
			return err
		}},
	} {
		for _, tc := range []struct {
			d  time.Duration
			ok bool
		}{
			{0, false},
			{500 * time.Nanosecond, false},
			{MinLease - 1, false},
			{MinLease, true},
			{copylog.MaxLease, true},
			{copylog.MaxLease + time.Microsecond, false},
		} {
			name := fmt.Sprintf("%s %v", op.name, tc.d)
			e, _, _ := newBroker(t)
			hold, err := e.Reserve(ctx, ReserveRequest{Domain: "c", Entries: entry("db", "a"), Copies: 2, Session: "s", Lease: time.Minute})
			if err != nil || !hold.OK {
				t.Fatalf("%s: reserve: %+v, %v", name, hold, err)
			}
			tr, err := e.Transfer(ctx, hold.HoldID, 1, time.Minute)
			if err != nil {
				t.Fatalf("%s: transfer: %v", name, err)
			}
			err = op.f(e, hold.HoldID, tr.TransferID, tc.d)
			if tc.ok {
				if err != nil {
					t.Errorf("%s: got %v, want no error", name, err)
				}
				continue
			}
			var in *descriptors.InputError
			if !errors.As(err, &in) || in.Field != op.field {
				t.Errorf("%s: got %v, want an *InputError of field %q", name, err, op.field)
			}
		}
	}
}
