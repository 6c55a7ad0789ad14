package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/charonlimit/charon/copylog"
	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/copystore"
	"github.com/charonlimit/charon/internal/store/memstore"
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

// copyTree has a copy-limited resource with a group, a rate-limited one,
// and a domain allowing unconfigured resources.
func copyTree(t *testing.T) *descriptors.Tree {
	t.Helper()
	tree, err := descriptors.NewTree([]descriptors.DomainSpec{
		{Config: descriptors.DomainConfig{Name: "c"}, Nodes: []*descriptors.Node{
			{Key: "db", Limit: &descriptors.Limit{Copies: &descriptors.Copies{
				DomainLimit: 3, GlobalLimit: 5,
				Groups: []descriptors.Group{{Name: "team", Limit: 4, Members: []string{"a", "b"}}},
			}}},
			{Key: "rate", Limit: &descriptors.Limit{Policy: lyft(3, time.Second)}},
			{Key: "free", Limit: &descriptors.Limit{Unlimited: true}},
		}},
		{Config: descriptors.DomainConfig{Name: "open", AllowUnconfigured: true}},
		{Config: descriptors.DomainConfig{Name: "kill", IgnoreLimits: true}, Nodes: []*descriptors.Node{
			{Key: "rate", Limit: &descriptors.Limit{Policy: lyft(1, time.Second)}},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return tree
}

func newCopyEngine(t *testing.T) (*Engine, *fakeCopies, *clock) {
	t.Helper()
	clk := newClock()
	fc := &fakeCopies{}
	st := memstore.New(memstore.Options{})
	t.Cleanup(func() { st.Close() })
	e := New(Options{Store: st, Now: clk.Now, Copies: fc})
	e.SetTree(copyTree(t))
	return e, fc, clk
}

func TestIDs(t *testing.T) {
	for _, r := range []string{"c/db", "x", strings.Repeat("r/é.", 80)} {
		id, err := NewID(r)
		if err != nil {
			t.Fatal(err)
		}
		if len(id) > copylog.MaxIDLen {
			t.Errorf("id of %d bytes, longer than %d", len(id), copylog.MaxIDLen)
		}
		got, ok := ResourceOf(id)
		if !ok || got != r {
			t.Errorf("ResourceOf(NewID(%q)) = %q, %v", r, got, ok)
		}
		id2, _ := NewID(r)
		if id2 == id {
			t.Errorf("two ids of %q are equal", r)
		}
	}
	for _, bad := range []string{"", ".", "abc", "YQ.", "YQ.short", "!!.AAAAAAAAAAAAAAAAAAAAAA", ".AAAAAAAAAAAAAAAAAAAAAA"} {
		if r, ok := ResourceOf(bad); ok {
			t.Errorf("ResourceOf(%q) = %q, true; want false", bad, r)
		}
	}
	s, err := NewSessionID()
	if err != nil || len(s) != 22 {
		t.Errorf("NewSessionID() = %q, %v", s, err)
	}
}

func TestBulkRequest(t *testing.T) {
	e, _, clk := newCopyEngine(t)
	ctx := context.Background()
	r, err := e.Request(ctx, "c", entries("rate", "u"), 5, 2)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Decision.OK || r.Decision.Granted != 3 || r.Match.Resource != "c/rate" || r.Match.Domain != "u" {
		t.Errorf("first request: got %+v", r)
	}
	r, err = e.Request(ctx, "c", entries("rate", "u"), 2, 1)
	if err != nil || r.Decision.OK || r.Decision.Granted != 0 || r.Decision.RetryAfter <= 0 {
		t.Errorf("second request: got %+v, %v; want a rejection with retry_after", r.Decision, err)
	}
	r, err = e.Request(ctx, "c", entries("rate", "u"), 2, 0)
	if err != nil || !r.Decision.OK || r.Decision.Granted != 0 {
		t.Errorf("min 0: got %+v, %v; want ok with 0 granted", r.Decision, err)
	}
	clk.Advance(time.Second)
	if r, _ = e.Request(ctx, "c", entries("rate", "u"), 1, 1); !r.Decision.OK {
		t.Errorf("after the window: got %+v, want granted", r.Decision)
	}
	if r, _ = e.Request(ctx, "c", entries("free", "u"), 7, 7); !r.Decision.OK || r.Decision.Granted != 7 || !r.Unlimited {
		t.Errorf("unlimited: got %+v", r)
	}
	if r, _ = e.Request(ctx, "open", entries("any", "u"), 7, 7); !r.Decision.OK || r.Decision.Granted != 7 || !r.Unlimited {
		t.Errorf("allow_unconfigured: got %+v", r)
	}
	if r, _ = e.Request(ctx, "kill", entries("rate", "u"), 9, 9); !r.Decision.OK || r.Decision.Granted != 9 || !r.Shadow {
		t.Errorf("ignore_limits: got %+v", r)
	}
}

func TestBulkRequestErrors(t *testing.T) {
	e, _, _ := newCopyEngine(t)
	fs := &fakeStore{err: errors.New("down")}
	down := New(Options{Store: fs})
	down.SetTree(copyTree(t))
	for _, tc := range []struct {
		name        string
		e           *Engine
		domain      string
		es          []descriptors.Entry
		copies, min int64
		want        error
		field       string
	}{
		{"empty domain", e, "", entries("rate", "u"), 1, 1, nil, "resource.domain"},
		{"no entries", e, "c", nil, 1, 1, nil, "resource.entries"},
		{"empty key", e, "c", entries("", "u"), 1, 1, nil, "resource.entries[0].key"},
		{"zero copies", e, "c", entries("rate", "u"), 0, 0, nil, "copies"},
		{"min above copies", e, "c", entries("rate", "u"), 1, 2, nil, "min_copies"},
		{"unknown resource", e, "c", entries("nope", "u"), 1, 1, ErrUnknownResource, "resource"},
		{"unknown domain", e, "zz", entries("rate", "u"), 1, 1, ErrUnknownResource, "resource"},
		{"copy-limited", e, "c", entries("db", "a"), 1, 1, ErrCopyLimited, "resource"},
		{"store down", down, "c", entries("rate", "u"), 1, 1, ErrStore, ""},
	} {
		_, err := tc.e.Request(context.Background(), tc.domain, tc.es, tc.copies, tc.min)
		wantFieldError(t, tc.name, err, tc.want, tc.field)
	}
}

// wantFieldError checks that err is not nil, matches want (when not nil)
// and names field (when not empty) as its prefix.
func wantFieldError(t *testing.T, name string, err, want error, field string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: no error", name)
		return
	}
	if want != nil && !errors.Is(err, want) {
		t.Errorf("%s: got %v, want %v", name, err, want)
	}
	if field != "" && !strings.HasPrefix(err.Error(), field+":") {
		t.Errorf("%s: error %q does not name field %q", name, err, field)
	}
}

func TestReserveReleaseTransferSeize(t *testing.T) {
	e, fc, clk := newCopyEngine(t)
	ctx := context.Background()
	res, err := e.Reserve(ctx, ReserveRequest{Domain: "c", Entries: entries("db", "a"), Copies: 5, Min: 1, Lease: 10 * time.Second})
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
	rej, err := e.Reserve(ctx, ReserveRequest{Domain: "c", Entries: entries("db", "b"), Copies: 2, Min: 2, Lease: time.Second})
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
	if err != nil || ka.Holds != 1 || !ka.Expires.Equal(clk.Now().Add(20*time.Second)) {
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
	e, _, clk := newCopyEngine(t)
	ctx := context.Background()
	res, err := e.Reserve(ctx, ReserveRequest{Domain: "c", Entries: entries("db", "a"), Copies: 3, Lease: 10 * time.Second})
	if err != nil || !res.OK {
		t.Fatalf("reserve: %+v, %v", res, err)
	}
	clk.Advance(10 * time.Second)
	if _, err := e.Release(ctx, res.HoldID, 0); !errors.Is(err, copylog.ErrUnknownHold) {
		t.Errorf("release after the lease: got %v, want ErrUnknownHold", err)
	}
	again, err := e.Reserve(ctx, ReserveRequest{Domain: "c", Entries: entries("db", "a"), Copies: 3, Lease: time.Second})
	if err != nil || again.Granted != 3 {
		t.Errorf("reserve after the lapse: got %+v, %v", again, err)
	}
}

func TestUnconfiguredReserve(t *testing.T) {
	e, _, _ := newCopyEngine(t)
	ctx := context.Background()
	res, err := e.Reserve(ctx, ReserveRequest{Domain: "open", Entries: entries("x", "y"), Copies: 1000, Lease: time.Second})
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
	e, fc, _ := newCopyEngine(t)
	ctx := context.Background()
	res, err := e.Reserve(ctx, ReserveRequest{Domain: "c", Entries: entries("db", "a"), Copies: 2, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	unknownHold, _ := NewID("c/db")
	noStore := New(Options{})
	noStore.SetTree(copyTree(t))
	// reserve reserves copies of c's key for domain a.
	reserve := func(key string, copies int64, lease time.Duration) func() error {
		return func() error {
			_, err := e.Reserve(ctx, ReserveRequest{Domain: "c", Entries: entries(key, "a"), Copies: copies, Lease: lease})
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
		{"reserve unknown", reserve("nope", 1, time.Second), ErrUnknownResource, "resource"},
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
	// Copy limits of the rate path stay as they were: RLS answers OK.
	resp, err := e.ShouldRateLimit(ctx, &Request{Domain: "c", Descriptors: []Descriptor{desc("db", "a")}})
	if err != nil || resp.Code != CodeOK || resp.Statuses[0].Limit != nil {
		t.Errorf("RLS on a copy-limited resource: %+v, %v", resp, err)
	}
}

// TestLeaseBounds: a lease or ttl outside [MinLease, copylog.MaxLease] is an
// *InputError naming its own field; copylog would refuse one under a
// microsecond as a "lease" whatever the field.
func TestLeaseBounds(t *testing.T) {
	ctx := context.Background()
	for _, op := range []struct {
		name, field string
		f           func(e *Engine, holdID, transferID string, d time.Duration) error
	}{
		{"reserve", "lease", func(e *Engine, _, _ string, d time.Duration) error {
			_, err := e.Reserve(ctx, ReserveRequest{Domain: "c", Entries: entries("db", "b"), Copies: 1, Lease: d})
			return err
		}},
		{"transfer", "ttl", func(e *Engine, holdID, _ string, d time.Duration) error {
			_, err := e.Transfer(ctx, holdID, 1, d)
			return err
		}},
		{"seize", "lease", func(e *Engine, _, transferID string, d time.Duration) error {
			_, err := e.Seize(ctx, transferID, "s", d)
			return err
		}},
		{"keepalive", "lease", func(e *Engine, holdID, _ string, d time.Duration) error {
			_, err := e.KeepAlive(ctx, holdID, d)
			return err
		}},
		{"keepalive session", "lease", func(e *Engine, _, _ string, d time.Duration) error {
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
			e, _, _ := newCopyEngine(t)
			hold, err := e.Reserve(ctx, ReserveRequest{Domain: "c", Entries: entries("db", "a"), Copies: 2, Session: "s", Lease: time.Minute})
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
			var in *InputError
			if !errors.As(err, &in) || in.Field != op.field {
				t.Errorf("%s: got %v, want an *InputError of field %q", name, err, op.field)
			}
		}
	}
}
