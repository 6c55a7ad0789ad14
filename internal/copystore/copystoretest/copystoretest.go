package copystoretest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/charonlimit/charon/copylog"
	"github.com/charonlimit/charon/internal/copystore"
)

// T0 is the instant the suite's operations start from.
var T0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// Lease is the lease of the suite's holds unless a subtest says otherwise.
const Lease = time.Hour

// runID makes the suite's resource names unique across runs sharing a
// backend.
var runID = fmt.Sprintf("%08x", rand.Uint32())

var resourceSeq atomic.Uint64

// Resource returns a resource name no other call in this process returns,
// safe as a Redis key part: "cst_<run>_<name>_<n>".
func Resource(name string) string {
	name = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, name)
	return fmt.Sprintf("cst_%s_%s_%d", runID, name, resourceSeq.Add(1))
}

// Run runs the conformance suite against stores made by newStore, one per
// subtest; the suite closes each at the end of its subtest.
func Run(t *testing.T, newStore func(t *testing.T) copystore.Store) {
	t.Helper()
	tests := []struct {
		name string
		fn   func(t *testing.T, s copystore.Store)
	}{
		{"DomainLimit", testDomainLimit},
		{"GlobalLimit", testGlobalLimit},
		{"Groups", testGroups},
		{"GroupsCapturedAtReserve", testGroupsCaptured},
		{"Overrides", testOverrides},
		{"LargestGrantOrNothing", testLargestOrNothing},
		{"LoweredLimit", testLoweredLimit},
		{"PartialRelease", testPartialRelease},
		{"OverRelease", testOverRelease},
		{"UnknownHoldAndTransfer", testUnknown},
		{"ArgumentErrors", testArgumentErrors},
		{"HoldIDInUse", testHoldIDInUse},
		{"TransferAndSeize", testTransferSeize},
		{"SeizeExpiredOrSeized", testSeizeExpired},
		{"LeaseLapsesAtExpiry", testLeaseLapse},
		{"KeepAlive", testKeepAlive},
		{"ReleaseSession", testReleaseSession},
		{"IdempotentReserve", testIdempotent},
		{"FencingTokens", testTokens},
		{"Reap", testReap},
		{"ResourcesIndependent", testIndependent},
		{"Close", testClose},
		{"TracesMatchCopylog", testTraces},
		{"Concurrent", testConcurrentLimits},
		{"Linearizable", testLinearizable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newStore(t)
			t.Cleanup(func() { s.Close() })
			tt.fn(t, s)
		})
	}
}

var ctx = context.Background()

// emptyOK lets a store answer an empty slice or map where copylog has nil.
var emptyOK = cmpopts.EquateEmpty()

// at is T0 plus d.
func at(d time.Duration) time.Time { return T0.Add(d) }

// holdSeq numbers the suite's hold and transfer ids.
var holdSeq atomic.Uint64

func newID(kind string) string { return fmt.Sprintf("%s-%s-%d", kind, runID, holdSeq.Add(1)) }

// req is a reserve of copies (at least min) for domain, with a fresh hold id
// and no session.
func req(domain string, copies, min int64) copylog.ReserveRequest {
	return copylog.ReserveRequest{Domain: domain, Copies: copies, Min: min, HoldID: newID("h"), Lease: Lease}
}

func reserve(t *testing.T, s copystore.Store, now time.Time, res string, cfg *copylog.Config, r copylog.ReserveRequest) copylog.Reservation {
	t.Helper()
	got, err := s.Reserve(ctx, now, res, cfg, r)
	if err != nil {
		t.Fatalf("Reserve(%s, %+v): %v", res, r, err)
	}
	return got
}

// grant reserves and demands a grant of exactly want copies.
func grant(t *testing.T, s copystore.Store, now time.Time, res string, cfg *copylog.Config, r copylog.ReserveRequest, want int64) copylog.Reservation {
	t.Helper()
	got := reserve(t, s, now, res, cfg, r)
	if !got.OK || got.Granted != want {
		t.Fatalf("Reserve(%s, %s: %d min %d) = OK %v, %d copies; want %d\n%+v", res, r.Domain, r.Copies, r.Min, got.OK, got.Granted, want, got)
	}
	if got.HoldID != r.HoldID {
		t.Fatalf("Reserve: hold id %q, want %q", got.HoldID, r.HoldID)
	}
	return got
}

// reject reserves and demands a rejection that changed nothing.
func reject(t *testing.T, s copystore.Store, now time.Time, res string, cfg *copylog.Config, r copylog.ReserveRequest) copylog.Reservation {
	t.Helper()
	got := reserve(t, s, now, res, cfg, r)
	if got.OK || got.Granted != 0 || got.HoldID != "" || got.Token != 0 {
		t.Fatalf("Reserve(%s, %s: %d min %d) granted, want a rejection: %+v", res, r.Domain, r.Copies, r.Min, got)
	}
	return got
}

func release(t *testing.T, s copystore.Store, now time.Time, res, hold string, copies int64) copylog.ReleaseResult {
	t.Helper()
	got, err := s.Release(ctx, now, res, hold, copies)
	if err != nil {
		t.Fatalf("Release(%s, %s, %d): %v", res, hold, copies, err)
	}
	return got
}

// wantErr demands an error wrapping target.
func wantErr(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: err = %v, want %v", what, err, target)
	}
}

// free is how many copies domain can get now: a reserve of up to max with
// min 1, released at once.
func free(t *testing.T, s copystore.Store, now time.Time, res string, cfg *copylog.Config, domain string, max int64) int64 {
	t.Helper()
	r := reserve(t, s, now, res, cfg, req(domain, max, 1))
	if !r.OK {
		return 0
	}
	release(t, s, now, res, r.HoldID, 0)
	return r.Granted
}

func wantFree(t *testing.T, s copystore.Store, now time.Time, res string, cfg *copylog.Config, domain string, want int64) {
	t.Helper()
	if got := free(t, s, now, res, cfg, domain, 1000); got != want {
		t.Fatalf("%s can reserve %d copies of %s, want %d", domain, got, res, want)
	}
}

func testDomainLimit(t *testing.T, s copystore.Store) {
	res := Resource("domain")
	cfg := &copylog.Config{DomainLimit: 3}
	r1 := grant(t, s, T0, res, cfg, req("a", 2, 2), 2)
	if want := (copylog.Context{DomainLimit: 3, DomainHeld: 2, TotalHeld: 2}); !cmp.Equal(want, r1.Context, emptyOK) {
		t.Errorf("context (-want +got):\n%s", cmp.Diff(want, r1.Context, emptyOK))
	}
	if !r1.Expires.Equal(T0.Add(Lease)) {
		t.Errorf("Expires = %v, want %v", r1.Expires, T0.Add(Lease))
	}
	grant(t, s, T0, res, cfg, req("a", 1, 1), 1)
	rj := reject(t, s, T0, res, cfg, req("a", 1, 1))
	if !rj.LimitedByDomain || rj.Context.DomainHeld != 3 {
		t.Errorf("rejection: LimitedByDomain %v, DomainHeld %d; want true, 3", rj.LimitedByDomain, rj.Context.DomainHeld)
	}
	// Another domain has its own limit.
	grant(t, s, T0, res, cfg, req("b", 5, 1), 3)
	release(t, s, T0, res, r1.HoldID, 0)
	wantFree(t, s, T0, res, cfg, "a", 2)
}

func testGlobalLimit(t *testing.T, s copystore.Store) {
	res := Resource("global")
	cfg := &copylog.Config{DomainLimit: 3, GlobalLimit: 5}
	grant(t, s, T0, res, cfg, req("a", 3, 1), 3)
	r := grant(t, s, T0, res, cfg, req("b", 3, 1), 2)
	if !r.LimitedByGlobal || r.LimitedByDomain || r.Context.TotalHeld != 5 || r.Context.GlobalLimit != 5 {
		t.Errorf("b's partial grant: %+v", r)
	}
	rj := reject(t, s, T0, res, cfg, req("c", 1, 1))
	if !rj.LimitedByGlobal {
		t.Errorf("c's rejection: LimitedByGlobal false: %+v", rj)
	}
	release(t, s, T0, res, r.HoldID, 1)
	wantFree(t, s, T0, res, cfg, "c", 1)
}

var groupCfg = &copylog.Config{
	DomainLimit: 10,
	GlobalLimit: 20,
	Groups: []copylog.Group{
		{Name: "eu", Limit: 4, Members: []string{"paris", "berlin"}},
		{Name: "prod", Limit: 6, Members: []string{"berlin", "tokyo"}},
	},
}

func testGroups(t *testing.T, s copystore.Store) {
	res := Resource("groups")
	cfg := groupCfg
	// berlin takes one copy from each of eu and prod.
	r := grant(t, s, T0, res, cfg, req("berlin", 3, 1), 3)
	if diff := cmp.Diff([]string{"eu", "prod"}, r.Groups, emptyOK); diff != "" {
		t.Errorf("berlin's groups (-want +got):\n%s", diff)
	}
	want := []copylog.GroupContext{{Name: "eu", Limit: 4, Held: 3}, {Name: "prod", Limit: 6, Held: 3}}
	if diff := cmp.Diff(want, r.Context.Groups, emptyOK); diff != "" {
		t.Errorf("berlin's group context (-want +got):\n%s", diff)
	}
	p := grant(t, s, T0, res, cfg, req("paris", 5, 1), 1)
	if p.LimitedByGroup != "eu" {
		t.Errorf("paris LimitedByGroup = %q, want eu", p.LimitedByGroup)
	}
	tk := grant(t, s, T0, res, cfg, req("tokyo", 5, 1), 3)
	if tk.LimitedByGroup != "prod" {
		t.Errorf("tokyo LimitedByGroup = %q, want prod", tk.LimitedByGroup)
	}
	reject(t, s, T0, res, cfg, req("berlin", 1, 1))
	// A domain in no group only meets the domain and global limits.
	grant(t, s, T0, res, cfg, req("lima", 10, 1), 10)
	rj := reject(t, s, T0, res, cfg, req("quito", 10, 4))
	if !rj.LimitedByGlobal || rj.Context.TotalHeld != 17 || len(rj.Context.Groups) != 0 {
		t.Errorf("quito's rejection: %+v", rj)
	}
	release(t, s, T0, res, r.HoldID, 2)
	wantFree(t, s, T0, res, cfg, "paris", 2)
	wantFree(t, s, T0, res, cfg, "tokyo", 2)
}

func testGroupsCaptured(t *testing.T, s copystore.Store) {
	res := Resource("captured")
	before := &copylog.Config{DomainLimit: 5, Groups: []copylog.Group{{Name: "g", Limit: 5, Members: []string{"a", "b"}}}}
	after := &copylog.Config{DomainLimit: 5, Groups: []copylog.Group{{Name: "g", Limit: 5, Members: []string{"b"}}}}
	r := grant(t, s, T0, res, before, req("a", 4, 1), 4)
	// a left the group: its hold still counts in g's pool until released...
	wantFree(t, s, T0, res, after, "b", 1)
	// ...and its release gives the copies back to g, under the new config.
	release(t, s, T0, res, r.HoldID, 0)
	wantFree(t, s, T0, res, after, "b", 5)
	wantFree(t, s, T0, res, after, "a", 5)
}

func testOverrides(t *testing.T, s copystore.Store) {
	res := Resource("overrides")
	cfg := &copylog.Config{DomainLimit: 2, Overrides: map[string]int64{"big": 7, "none": 0}}
	r := grant(t, s, T0, res, cfg, req("big", 9, 1), 7)
	if !r.LimitedByDomain || r.Context.DomainLimit != 7 {
		t.Errorf("big: %+v", r)
	}
	grant(t, s, T0, res, cfg, req("small", 9, 1), 2)
	rj := reject(t, s, T0, res, cfg, req("none", 1, 0))
	if !rj.LimitedByDomain || rj.Context.DomainLimit != 0 {
		t.Errorf("none: %+v", rj)
	}
}

func testLargestOrNothing(t *testing.T, s copystore.Store) {
	res := Resource("largest")
	cfg := &copylog.Config{DomainLimit: 5}
	grant(t, s, T0, res, cfg, req("a", 2, 2), 2)
	// 3 free: copies 5 min 2 gets 3.
	r := grant(t, s, T0, res, cfg, req("a", 5, 2), 3)
	if !r.LimitedByDomain {
		t.Errorf("LimitedByDomain false: %+v", r)
	}
	release(t, s, T0, res, r.HoldID, 2)
	// 2 free: min 3 gets nothing, and takes nothing.
	rj := reject(t, s, T0, res, cfg, req("a", 4, 3))
	if rj.Context.DomainHeld != 3 {
		t.Errorf("after rejection DomainHeld = %d, want 3", rj.Context.DomainHeld)
	}
	// min 0 means 1; the full request is granted when it fits.
	r = grant(t, s, T0, res, cfg, req("a", 1, 0), 1)
	if r.LimitedByDomain || r.LimitedByGlobal || r.LimitedByGroup != "" {
		t.Errorf("full grant names a limit: %+v", r)
	}
	grant(t, s, T0, res, cfg, req("a", 1, 1), 1)
	reject(t, s, T0, res, cfg, req("a", 1, 0))
}

func testLoweredLimit(t *testing.T, s copystore.Store) {
	res := Resource("lowered")
	high := &copylog.Config{DomainLimit: 5}
	low := &copylog.Config{DomainLimit: 2}
	r := grant(t, s, T0, res, high, req("a", 5, 1), 5)
	// The holds are kept; nothing is granted until enough are released.
	rj := reject(t, s, T0, res, low, req("a", 1, 1))
	if rj.Context.DomainHeld != 5 || rj.Context.DomainLimit != 2 {
		t.Errorf("context: %+v", rj.Context)
	}
	release(t, s, T0, res, r.HoldID, 3)
	reject(t, s, T0, res, low, req("a", 1, 1))
	release(t, s, T0, res, r.HoldID, 1)
	wantFree(t, s, T0, res, low, "a", 1)
}

func testPartialRelease(t *testing.T, s copystore.Store) {
	res := Resource("partial")
	cfg := &copylog.Config{DomainLimit: 10, GlobalLimit: 10, Groups: []copylog.Group{{Name: "g", Limit: 10, Members: []string{"a"}}}}
	r := grant(t, s, T0, res, cfg, req("a", 7, 1), 7)
	grant(t, s, T0, res, cfg, req("b", 1, 1), 1)
	got := release(t, s, T0, res, r.HoldID, 2)
	want := copylog.ReleaseResult{Released: 2, Left: 5, Domain: "a", DomainHeld: 5, TotalHeld: 6}
	if diff := cmp.Diff(want, got, emptyOK); diff != "" {
		t.Errorf("release 2 (-want +got):\n%s", diff)
	}
	got = release(t, s, T0, res, r.HoldID, 4)
	if got.Released != 4 || got.Left != 1 || got.DomainHeld != 1 || got.TotalHeld != 2 {
		t.Errorf("release 4: %+v", got)
	}
	// 0 releases the rest; the hold is then gone.
	got = release(t, s, T0, res, r.HoldID, 0)
	if got.Released != 1 || got.Left != 0 || got.DomainHeld != 0 || got.TotalHeld != 1 {
		t.Errorf("release rest: %+v", got)
	}
	_, err := s.Release(ctx, T0, res, r.HoldID, 0)
	wantErr(t, "release of a released hold", err, copylog.ErrUnknownHold)
	// The group's pool got every copy back.
	wantFree(t, s, T0, res, cfg, "a", 9)
}

func testOverRelease(t *testing.T, s copystore.Store) {
	res := Resource("over")
	cfg := &copylog.Config{DomainLimit: 5}
	r := grant(t, s, T0, res, cfg, req("a", 3, 1), 3)
	_, err := s.Release(ctx, T0, res, r.HoldID, 4)
	wantErr(t, "release 4 of 3", err, copylog.ErrOverRelease)
	_, err = s.Transfer(ctx, T0, res, r.HoldID, 4, time.Minute, newID("x"))
	wantErr(t, "transfer 4 of 3", err, copylog.ErrOverTransfer)
	// Nothing changed: the hold still has 3.
	got := release(t, s, T0, res, r.HoldID, 3)
	if got.Released != 3 || got.Left != 0 {
		t.Errorf("release 3: %+v", got)
	}
}

func testUnknown(t *testing.T, s copystore.Store) {
	never := Resource("never")
	res := Resource("unknown")
	cfg := &copylog.Config{DomainLimit: 5}
	grant(t, s, T0, res, cfg, req("a", 1, 1), 1)
	for _, r := range []string{never, res} {
		_, err := s.Release(ctx, T0, r, "nope", 0)
		wantErr(t, "release of "+r, err, copylog.ErrUnknownHold)
		_, err = s.Transfer(ctx, T0, r, "nope", 0, time.Minute, newID("x"))
		wantErr(t, "transfer of "+r, err, copylog.ErrUnknownHold)
		_, err = s.KeepAlive(ctx, T0, r, "", "nope", time.Minute)
		wantErr(t, "keep-alive of "+r, err, copylog.ErrUnknownHold)
		_, err = s.Seize(ctx, T0, r, "nope", newID("h"), "", time.Minute)
		wantErr(t, "seize of "+r, err, copylog.ErrUnknownTransfer)
		got, err := s.ReleaseSession(ctx, T0, r, "nobody")
		if err != nil || got.Holds != 0 || got.Copies != 0 {
			t.Errorf("ReleaseSession of an unknown session of %s = %+v, %v; want nothing", r, got, err)
		}
		ka, err := s.KeepAlive(ctx, T0, r, "nobody", "", time.Minute)
		if err != nil || ka.Holds != 0 {
			t.Errorf("KeepAlive of an unknown session of %s = %+v, %v; want nothing", r, ka, err)
		}
	}
	wantFree(t, s, T0, res, cfg, "a", 4)
}

func testArgumentErrors(t *testing.T, s copystore.Store) {
	res := Resource("args")
	cfg := &copylog.Config{DomainLimit: 5}
	h := grant(t, s, T0, res, cfg, req("a", 2, 1), 2)
	bad := func(mod func(*copylog.ReserveRequest)) copylog.ReserveRequest {
		r := req("a", 1, 1)
		mod(&r)
		return r
	}
	cases := []struct {
		name string
		err  error
		fn   func() error
	}{
		{"nil config", copylog.ErrBadConfig, func() error {
			_, err := s.Reserve(ctx, T0, res, nil, req("a", 1, 1))
			return err
		}},
		{"negative limit", copylog.ErrBadConfig, func() error {
			_, err := s.Reserve(ctx, T0, res, &copylog.Config{DomainLimit: -1}, req("a", 1, 1))
			return err
		}},
		{"copies 0", copylog.ErrBadCopies, func() error {
			_, err := s.Reserve(ctx, T0, res, cfg, bad(func(r *copylog.ReserveRequest) { r.Copies, r.Min = 0, 0 }))
			return err
		}},
		{"copies above MaxCopies", copylog.ErrBadCopies, func() error {
			_, err := s.Reserve(ctx, T0, res, cfg, bad(func(r *copylog.ReserveRequest) { r.Copies = copylog.MaxCopies + 1 }))
			return err
		}},
		{"min above copies", copylog.ErrBadMin, func() error {
			_, err := s.Reserve(ctx, T0, res, cfg, bad(func(r *copylog.ReserveRequest) { r.Min = 2 }))
			return err
		}},
		{"lease 0", copylog.ErrBadLease, func() error {
			_, err := s.Reserve(ctx, T0, res, cfg, bad(func(r *copylog.ReserveRequest) { r.Lease = 0 }))
			return err
		}},
		{"empty hold id", copylog.ErrBadID, func() error {
			_, err := s.Reserve(ctx, T0, res, cfg, bad(func(r *copylog.ReserveRequest) { r.HoldID = "" }))
			return err
		}},
		{"long domain", copylog.ErrBadID, func() error {
			_, err := s.Reserve(ctx, T0, res, cfg, bad(func(r *copylog.ReserveRequest) { r.Domain = strings.Repeat("d", copylog.MaxIDLen+1) }))
			return err
		}},
		{"release -1", copylog.ErrBadCopies, func() error {
			_, err := s.Release(ctx, T0, res, h.HoldID, -1)
			return err
		}},
		{"release empty id", copylog.ErrBadID, func() error {
			_, err := s.Release(ctx, T0, res, "", 0)
			return err
		}},
		{"transfer ttl 0", copylog.ErrBadLease, func() error {
			_, err := s.Transfer(ctx, T0, res, h.HoldID, 1, 0, newID("x"))
			return err
		}},
		{"transfer empty id", copylog.ErrBadID, func() error {
			_, err := s.Transfer(ctx, T0, res, h.HoldID, 1, time.Minute, "")
			return err
		}},
		{"seize lease 0", copylog.ErrBadLease, func() error {
			_, err := s.Seize(ctx, T0, res, "x", newID("h"), "", 0)
			return err
		}},
		{"keep-alive of nothing", copylog.ErrBadID, func() error {
			_, err := s.KeepAlive(ctx, T0, res, "", "", time.Minute)
			return err
		}},
		{"keep-alive lease above MaxLease", copylog.ErrBadLease, func() error {
			_, err := s.KeepAlive(ctx, T0, res, "", h.HoldID, copylog.MaxLease+time.Microsecond)
			return err
		}},
		{"release of session \"\"", copylog.ErrBadID, func() error {
			_, err := s.ReleaseSession(ctx, T0, res, "")
			return err
		}},
	}
	for _, c := range cases {
		err := c.fn()
		if !errors.Is(err, c.err) {
			t.Errorf("%s: err = %v, want %v", c.name, err, c.err)
		}
		if errors.Is(err, copystore.ErrUnavailable) {
			t.Errorf("%s: an argument error wraps ErrUnavailable: %v", c.name, err)
		}
	}
	// Nothing changed.
	wantFree(t, s, T0, res, cfg, "a", 3)
	if got := release(t, s, T0, res, h.HoldID, 0); got.Released != 2 {
		t.Errorf("the hold has %d copies, want 2", got.Released)
	}
}

func testHoldIDInUse(t *testing.T, s copystore.Store) {
	res := Resource("inuse")
	cfg := &copylog.Config{DomainLimit: 5}
	r := grant(t, s, T0, res, cfg, req("a", 1, 1), 1)
	again := req("a", 1, 1)
	again.HoldID = r.HoldID
	_, err := s.Reserve(ctx, T0, res, cfg, again)
	wantErr(t, "reserve with a hold id in use", err, copylog.ErrHoldExists)
	h2 := grant(t, s, T0, res, cfg, req("a", 2, 1), 2)
	x, err := s.Transfer(ctx, T0, res, h2.HoldID, 1, time.Minute, newID("x"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Transfer(ctx, T0, res, h2.HoldID, 1, time.Minute, x.TransferID)
	wantErr(t, "transfer with a transfer id in use", err, copylog.ErrTransferExists)
	_, err = s.Seize(ctx, T0, res, x.TransferID, r.HoldID, "", time.Minute)
	wantErr(t, "seize into a hold id in use", err, copylog.ErrHoldExists)
	// The transfer is still staged.
	if _, err := s.Seize(ctx, T0, res, x.TransferID, newID("h"), "", time.Minute); err != nil {
		t.Fatalf("seize after the failed one: %v", err)
	}
	wantFree(t, s, T0, res, cfg, "a", 2)
}

func testTransferSeize(t *testing.T, s copystore.Store) {
	res := Resource("transfer")
	cfg := groupCfg
	h := grant(t, s, T0, res, cfg, req("berlin", 3, 1), 3)
	xid := newID("x")
	x, err := s.Transfer(ctx, T0, res, h.HoldID, 2, 5*time.Minute, xid)
	if err != nil {
		t.Fatal(err)
	}
	want := copylog.TransferResult{TransferID: xid, Copies: 2, Left: 1, Expires: at(5 * time.Minute)}
	if diff := cmp.Diff(want, x, emptyOK); diff != "" {
		t.Errorf("Transfer (-want +got):\n%s", diff)
	}
	// Staged copies still count against every pool of berlin.
	wantFree(t, s, T0, res, cfg, "paris", 1)
	wantFree(t, s, T0, res, cfg, "tokyo", 3)
	hid := newID("h")
	got, err := s.Seize(ctx, at(time.Minute), res, xid, hid, "sess", 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if got.Token <= h.Token {
		t.Errorf("seize token %d, not above the reserve's %d", got.Token, h.Token)
	}
	wantSeize := copylog.SeizeResult{HoldID: hid, Copies: 2, Token: got.Token, Expires: at(11 * time.Minute),
		Domain: "berlin", Groups: []string{"eu", "prod"}}
	if diff := cmp.Diff(wantSeize, got, emptyOK); diff != "" {
		t.Errorf("Seize (-want +got):\n%s", diff)
	}
	_, err = s.Seize(ctx, at(time.Minute), res, xid, newID("h"), "", time.Minute)
	wantErr(t, "second seize", err, copylog.ErrUnknownTransfer)
	// The seized hold is a hold like any: partial release, transfer of all.
	if r := release(t, s, at(time.Minute), res, hid, 1); r.Domain != "berlin" || r.Left != 1 {
		t.Errorf("release of the seized hold: %+v", r)
	}
	x2, err := s.Transfer(ctx, at(time.Minute), res, h.HoldID, 0, time.Minute, newID("x"))
	if err != nil || x2.Copies != 1 || x2.Left != 0 {
		t.Fatalf("transfer of all: %+v, %v", x2, err)
	}
	_, err = s.Release(ctx, at(time.Minute), res, h.HoldID, 0)
	wantErr(t, "release of a hold transferred away", err, copylog.ErrUnknownHold)
	release(t, s, at(time.Minute), res, hid, 0)
	wantFree(t, s, at(time.Minute), res, cfg, "paris", 3)
}

func testSeizeExpired(t *testing.T, s copystore.Store) {
	res := Resource("seizeexp")
	cfg := &copylog.Config{DomainLimit: 4}
	h := grant(t, s, T0, res, cfg, req("a", 4, 1), 4)
	x, err := s.Transfer(ctx, T0, res, h.HoldID, 3, time.Minute, newID("x"))
	if err != nil {
		t.Fatal(err)
	}
	// One µs before the ttl the transfer is there (a failed seize into a
	// hold id in use proves it without taking it).
	_, err = s.Seize(ctx, at(time.Minute-time.Microsecond), res, x.TransferID, h.HoldID, "", time.Minute)
	wantErr(t, "seize into the giver's hold id", err, copylog.ErrHoldExists)
	wantFree(t, s, at(time.Minute-time.Microsecond), res, cfg, "a", 0)
	// At the ttl it lapsed: its copies are free and it cannot be seized.
	got, err := s.Seize(ctx, at(time.Minute), res, x.TransferID, newID("h"), "", time.Minute)
	wantErr(t, "seize of a lapsed transfer", err, copylog.ErrUnknownTransfer)
	if got.Reaped.Transfers != 1 || got.Reaped.Copies != 3 {
		t.Errorf("Reaped = %+v, want 1 transfer of 3 copies", got.Reaped)
	}
	wantFree(t, s, at(time.Minute), res, cfg, "a", 3)
	release(t, s, at(time.Minute), res, h.HoldID, 0)
}

func testLeaseLapse(t *testing.T, s copystore.Store) {
	res := Resource("lapse")
	cfg := &copylog.Config{DomainLimit: 3}
	r := req("a", 3, 1)
	r.Lease = 10 * time.Second
	h := grant(t, s, T0, res, cfg, r, 3)
	if !h.Expires.Equal(at(10 * time.Second)) {
		t.Fatalf("Expires = %v, want T0+10s", h.Expires)
	}
	// A keep-alive of 1µs proves the hold is there without extending it.
	before := at(10*time.Second - time.Microsecond)
	ka, err := s.KeepAlive(ctx, before, res, "", h.HoldID, time.Microsecond)
	if err != nil || ka.Holds != 1 || !ka.Expires.Equal(at(10*time.Second)) {
		t.Fatalf("KeepAlive 1µs before expiry = %+v, %v; want the hold, expiring at T0+10s", ka, err)
	}
	reject(t, s, before, res, cfg, req("a", 1, 1))
	// At exactly the expiry the hold is gone.
	got, err := s.Release(ctx, at(10*time.Second), res, h.HoldID, 0)
	wantErr(t, "release at expiry", err, copylog.ErrUnknownHold)
	if want := (copylog.Reaped{Holds: 1, Copies: 3}); got.Reaped != want {
		t.Errorf("Reaped = %+v, want %+v", got.Reaped, want)
	}
	wantFree(t, s, at(10*time.Second), res, cfg, "a", 3)
}

func testKeepAlive(t *testing.T, s copystore.Store) {
	res := Resource("keepalive")
	cfg := &copylog.Config{DomainLimit: 10}
	mk := func(session string, lease time.Duration) copylog.Reservation {
		r := req("a", 1, 1)
		r.Session, r.Lease = session, lease
		return grant(t, s, T0, res, cfg, r, 1)
	}
	a1 := mk("s1", 10*time.Second)
	mk("s1", 20*time.Second)
	b := mk("s2", 10*time.Second)
	// The session's holds are extended to now+lease, never shortened.
	ka, err := s.KeepAlive(ctx, at(5*time.Second), res, "s1", "", 12*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if ka.Holds != 2 || !ka.Expires.Equal(at(17*time.Second)) {
		t.Errorf("KeepAlive(s1) = %+v; want 2 holds, least expiry T0+17s", ka)
	}
	// One hold by id.
	ka, err = s.KeepAlive(ctx, at(5*time.Second), res, "", b.HoldID, 30*time.Second)
	if err != nil || ka.Holds != 1 || !ka.Expires.Equal(at(35*time.Second)) {
		t.Errorf("KeepAlive(hold) = %+v, %v; want T0+35s", ka, err)
	}
	// At T0+17s a1 lapsed, the other s1 hold (T0+20s) and b live.
	wantFree(t, s, at(17*time.Second), res, cfg, "a", 8)
	_, err = s.Release(ctx, at(17*time.Second), res, a1.HoldID, 0)
	wantErr(t, "release of the lapsed hold", err, copylog.ErrUnknownHold)
	wantFree(t, s, at(20*time.Second), res, cfg, "a", 9)
	wantFree(t, s, at(35*time.Second), res, cfg, "a", 10)
	// A lapsed hold cannot be kept alive.
	_, err = s.KeepAlive(ctx, at(35*time.Second), res, "", b.HoldID, time.Minute)
	wantErr(t, "keep-alive of a lapsed hold", err, copylog.ErrUnknownHold)
}

func testReleaseSession(t *testing.T, s copystore.Store) {
	res := Resource("session")
	cfg := &copylog.Config{DomainLimit: 10}
	in := func(session string, copies int64) copylog.Reservation {
		r := req("a", copies, 1)
		r.Session = session
		return grant(t, s, T0, res, cfg, r, copies)
	}
	in("dead", 2)
	h := in("dead", 3)
	in("alive", 1)
	in("", 1)
	// A transfer staged from the dying session survives it.
	x, err := s.Transfer(ctx, T0, res, h.HoldID, 1, time.Minute, newID("x"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.ReleaseSession(ctx, T0, res, "dead")
	if err != nil {
		t.Fatal(err)
	}
	if got.Holds != 2 || got.Copies != 4 {
		t.Errorf("ReleaseSession = %+v, want 2 holds, 4 copies", got)
	}
	wantFree(t, s, T0, res, cfg, "a", 7)
	_, err = s.Release(ctx, T0, res, h.HoldID, 0)
	wantErr(t, "release of a dead session's hold", err, copylog.ErrUnknownHold)
	sz, err := s.Seize(ctx, T0, res, x.TransferID, newID("h"), "heir", time.Minute)
	if err != nil || sz.Copies != 1 {
		t.Fatalf("seize of the dead session's transfer: %+v, %v", sz, err)
	}
	got, err = s.ReleaseSession(ctx, T0, res, "heir")
	if err != nil || got.Holds != 1 || got.Copies != 1 {
		t.Errorf("ReleaseSession(heir) = %+v, %v", got, err)
	}
	again, err := s.ReleaseSession(ctx, T0, res, "dead")
	if err != nil || again.Holds != 0 {
		t.Errorf("second ReleaseSession = %+v, %v; want nothing", again, err)
	}
	wantFree(t, s, T0, res, cfg, "a", 8)
}

func testIdempotent(t *testing.T, s copystore.Store) {
	res := Resource("idem")
	cfg := &copylog.Config{DomainLimit: 5}
	r := req("a", 3, 1)
	r.RequestID, r.Session, r.Lease = "q1", "s1", 10*time.Second
	first := grant(t, s, T0, res, cfg, r, 3)
	if first.Replayed {
		t.Errorf("first reserve Replayed")
	}
	// A retry (even with another hold id, session and lease) gets the same
	// hold, refreshed and moved to the retry's session, and no new copies.
	retry := r
	retry.HoldID, retry.Session, retry.Lease = newID("h"), "s2", 20*time.Second
	got := reserve(t, s, at(time.Second), res, cfg, retry)
	if !got.OK || !got.Replayed || got.HoldGone || got.HoldID != first.HoldID || got.Granted != 3 || got.Token != first.Token {
		t.Fatalf("retry = %+v, want a replay of %+v", got, first)
	}
	if !got.Expires.Equal(at(21*time.Second)) || got.Context.DomainHeld != 3 {
		t.Errorf("retry: Expires %v (want T0+21s), DomainHeld %d (want 3)", got.Expires, got.Context.DomainHeld)
	}
	wantFree(t, s, at(time.Second), res, cfg, "a", 2)
	if rs, _ := s.ReleaseSession(ctx, at(time.Second), res, "s1"); rs.Holds != 0 {
		t.Errorf("the hold stayed in s1: %+v", rs)
	}
	// Another domain may not reuse the request id.
	other := req("b", 1, 1)
	other.RequestID = "q1"
	_, err := s.Reserve(ctx, at(time.Second), res, cfg, other)
	wantErr(t, "request id of another domain", err, copylog.ErrRequestIDReused)
	// After the hold is released, a retry still answers the first grant
	// (while the record lives) and takes nothing.
	if rs, err := s.ReleaseSession(ctx, at(2*time.Second), res, "s2"); err != nil || rs.Holds != 1 {
		t.Fatalf("ReleaseSession(s2) = %+v, %v", rs, err)
	}
	// The retry is told the hold is gone: not OK, nothing granted.
	got = reserve(t, s, at(3*time.Second), res, cfg, retry)
	if !got.Replayed || !got.HoldGone || got.OK || got.Granted != 0 || got.HoldID != first.HoldID || got.Context.DomainHeld != 0 {
		t.Errorf("retry after release = %+v, want a replay saying the hold is gone", got)
	}
	wantFree(t, s, at(3*time.Second), res, cfg, "a", 5)
	// Once the record lapsed, the request id makes a new hold.
	late := retry
	late.HoldID = newID("h")
	got = grant(t, s, at(time.Minute), res, cfg, late, 3)
	if got.Replayed || got.Token <= first.Token {
		t.Errorf("reserve after the record lapsed = %+v", got)
	}
}

func testTokens(t *testing.T, s copystore.Store) {
	res := Resource("tokens")
	cfg := &copylog.Config{DomainLimit: 5}
	var last int64
	next := func(what string, tok int64) {
		t.Helper()
		if tok <= last {
			t.Fatalf("%s: token %d, not above %d", what, tok, last)
		}
		last = tok
	}
	h := grant(t, s, T0, res, cfg, req("a", 2, 1), 2)
	next("first reserve", h.Token)
	reject(t, s, T0, res, cfg, req("a", 5, 5))
	h2 := grant(t, s, T0, res, cfg, req("b", 1, 1), 1)
	next("second reserve", h2.Token)
	x, err := s.Transfer(ctx, T0, res, h.HoldID, 0, time.Minute, newID("x"))
	if err != nil {
		t.Fatal(err)
	}
	sz, err := s.Seize(ctx, T0, res, x.TransferID, newID("h"), "", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	next("seize", sz.Token)
	// The resource empties by release...
	release(t, s, T0, res, sz.HoldID, 0)
	release(t, s, T0, res, h2.HoldID, 0)
	h3 := grant(t, s, T0, res, cfg, req("a", 1, 1), 1)
	next("reserve after the resource emptied", h3.Token)
	// ...by lapse and the reaper...
	r := req("a", 1, 1)
	r.Lease = time.Second
	release(t, s, T0, res, h3.HoldID, 0)
	h4 := grant(t, s, T0, res, cfg, r, 1)
	next("short lease", h4.Token)
	if err := s.Reap(ctx, at(time.Minute)); err != nil {
		t.Fatal(err)
	}
	h5 := grant(t, s, at(time.Minute), res, cfg, req("a", 1, 1), 1)
	next("reserve after the reaper emptied the resource", h5.Token)
	// ...and by a session's death.
	r = req("a", 1, 1)
	r.Session = "s"
	release(t, s, at(time.Minute), res, h5.HoldID, 0)
	next("session hold", grant(t, s, at(time.Minute), res, cfg, r, 1).Token)
	if _, err := s.ReleaseSession(ctx, at(time.Minute), res, "s"); err != nil {
		t.Fatal(err)
	}
	next("reserve after the session died", grant(t, s, at(time.Minute), res, cfg, req("a", 1, 1), 1).Token)
}

func testReap(t *testing.T, s copystore.Store) {
	cfg := &copylog.Config{DomainLimit: 3}
	var res []string
	var holds []copylog.Reservation
	for i := range 5 {
		r := Resource(fmt.Sprint("reap", i))
		res = append(res, r)
		q := req("a", 3, 1)
		q.Lease = time.Duration(i+1) * time.Second
		holds = append(holds, grant(t, s, T0, r, cfg, q, 3))
	}
	// Transfers lapse too.
	x, err := s.Transfer(ctx, T0, res[4], holds[4].HoldID, 1, 2*time.Second, newID("x"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Reap(ctx, at(2500*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	// The reaper took the first two holds and the transfer: an operation on
	// those resources reaps nothing more.
	for i, want := range []int64{3, 3, 0, 0, 1} {
		r := reserve(t, s, at(2500*time.Millisecond), res[i], cfg, req("a", 3, 1))
		if r.Granted != want {
			t.Errorf("%s after Reap at T0+2.5s: granted %d, want %d", res[i], r.Granted, want)
		}
		if r.Reaped != (copylog.Reaped{}) {
			t.Errorf("%s after Reap: the reserve reaped %+v, want nothing", res[i], r.Reaped)
		}
	}
	_, err = s.Seize(ctx, at(2500*time.Millisecond), res[4], x.TransferID, newID("h"), "", time.Minute)
	wantErr(t, "seize of a reaped transfer", err, copylog.ErrUnknownTransfer)
	// Reap before anything lapses changes nothing.
	if err := s.Reap(ctx, at(2500*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	ka, err := s.KeepAlive(ctx, at(2500*time.Millisecond), res[2], "", holds[2].HoldID, time.Microsecond)
	if err != nil || ka.Holds != 1 {
		t.Errorf("hold of %s after an early Reap: %+v, %v", res[2], ka, err)
	}
}

func testIndependent(t *testing.T, s copystore.Store) {
	a, b := Resource("indep"), Resource("indep")
	cfg := &copylog.Config{DomainLimit: 2}
	h := grant(t, s, T0, a, cfg, req("d", 2, 1), 2)
	grant(t, s, T0, b, cfg, req("d", 2, 1), 2)
	_, err := s.Release(ctx, T0, b, h.HoldID, 0)
	wantErr(t, "release of a's hold on b", err, copylog.ErrUnknownHold)
	release(t, s, T0, a, h.HoldID, 0)
	reject(t, s, T0, b, cfg, req("d", 1, 1))
}

func testClose(t *testing.T, s copystore.Store) {
	res := Resource("close")
	cfg := &copylog.Config{DomainLimit: 2}
	grant(t, s, T0, res, cfg, req("d", 1, 1), 1)
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	_, err := s.Reserve(ctx, T0, res, cfg, req("d", 1, 1))
	wantErr(t, "Reserve after Close", err, copystore.ErrUnavailable)
	_, err = s.Release(ctx, T0, res, "h", 0)
	wantErr(t, "Release after Close", err, copystore.ErrUnavailable)
	_, err = s.ReleaseSession(ctx, T0, res, "s")
	wantErr(t, "ReleaseSession after Close", err, copystore.ErrUnavailable)
	wantErr(t, "Reap after Close", s.Reap(ctx, T0), copystore.ErrUnavailable)
}
