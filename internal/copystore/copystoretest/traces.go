package copystoretest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/charonlimit/charon/copylog"
	"github.com/charonlimit/charon/internal/copystore"
)

// traceCfgs are the configs a trace switches between: d3 leaves group eu
// and the limits move, so holds outlive the config they were granted
// under.
var traceCfgs = []*copylog.Config{
	{DomainLimit: 4, GlobalLimit: 9, Groups: []copylog.Group{
		{Name: "eu", Limit: 5, Members: []string{"d1", "d3"}},
		{Name: "all", Limit: 7, Members: []string{"d1", "d2", "d3"}},
	}, Overrides: map[string]int64{"d2": 2}},
	{DomainLimit: 3, GlobalLimit: 6, Groups: []copylog.Group{
		{Name: "eu", Limit: 3, Members: []string{"d1"}},
	}},
}

// errClass names the copylog sentinel err wraps ("" for nil).
func errClass(err error) string {
	for _, e := range []error{copylog.ErrNilState, copylog.ErrBadConfig, copylog.ErrBadCopies, copylog.ErrBadMin,
		copylog.ErrBadLease, copylog.ErrBadID, copylog.ErrHoldExists, copylog.ErrTransferExists, copylog.ErrUnknownHold,
		copylog.ErrUnknownTransfer, copylog.ErrOverRelease, copylog.ErrOverTransfer, copylog.ErrRequestIDReused} {
		if errors.Is(err, e) {
			return e.Error()
		}
	}
	if err != nil {
		return "other: " + err.Error()
	}
	return ""
}

// testTraces replays seeded random sequences of every operation, at
// instants moving forward so that leases, transfers and reservation
// records lapse, on three resources, and demands from the store exactly
// the answers copylog gives on states of its own (a differential test: a
// script that mirrors copylog must agree with it on every field).
func testTraces(t *testing.T, s copystore.Store) {
	seen := map[string]int{}
	for seed := range uint64(4) {
		rng := rand.New(rand.NewPCG(seed, 99))
		names := []string{Resource("trace"), Resource("trace"), Resource("trace")}
		ref := map[string]*copylog.State{}
		for _, n := range names {
			ref[n] = new(copylog.State)
		}
		var holds, transfers, requests []string
		domains := map[string]string{} // request id -> domain
		// pick returns one of the last ids of list (the likely live ones),
		// or now and then an id never used.
		pick := func(list []string) string {
			if len(list) == 0 || rng.IntN(10) == 0 {
				return newID("unknown")
			}
			return list[len(list)-1-rng.IntN(min(len(list), 6))]
		}
		sessions := []string{"s1", "s2", "s3"}
		dur := func(max int) time.Duration { return time.Duration(1+rng.IntN(max)) * 500 * time.Millisecond }
		now := T0
		cfg := traceCfgs[0]
		for step := range 500 {
			now = now.Add(time.Duration(rng.IntN(300)) * time.Millisecond)
			if rng.IntN(50) == 0 {
				cfg = traceCfgs[rng.IntN(len(traceCfgs))]
			}
			res := names[rng.IntN(len(names))]
			st := ref[res]
			var what string
			var want, got any
			var wantErr, gotErr error
			switch op := rng.IntN(20); {
			case op < 7:
				k := int64(1 + rng.IntN(4))
				r := copylog.ReserveRequest{Domain: fmt.Sprint("d", 1+rng.IntN(4)), Copies: k, Min: int64(rng.IntN(int(k) + 1)),
					HoldID: newID("h"), Lease: dur(10)}
				if rng.IntN(3) > 0 {
					r.Session = sessions[rng.IntN(len(sessions))]
				}
				switch rng.IntN(4) {
				case 0:
					r.RequestID = newID("q")
					requests = append(requests, r.RequestID)
					domains[r.RequestID] = r.Domain
				case 1:
					// A retry, now and then from another domain.
					r.RequestID = pick(requests)
					if d, ok := domains[r.RequestID]; ok && rng.IntN(4) > 0 {
						r.Domain = d
					}
				}
				what = fmt.Sprintf("Reserve(%+v)", r)
				want, wantErr = copylog.Reserve(cfg, st, now, r)
				got, gotErr = s.Reserve(ctx, now, res, cfg, r)
				if wantErr == nil && want.(copylog.Reservation).OK {
					holds = append(holds, r.HoldID)
				}
			case op < 10:
				id, n := pick(holds), int64(rng.IntN(4))
				what = fmt.Sprintf("Release(%s, %d)", id, n)
				want, wantErr = copylog.Release(st, now, id, n)
				got, gotErr = s.Release(ctx, now, res, id, n)
			case op < 12:
				id, n, x := pick(holds), int64(rng.IntN(3)), newID("x")
				ttl := dur(6)
				what = fmt.Sprintf("Transfer(%s, %d, %v)", id, n, ttl)
				want, wantErr = copylog.Transfer(st, now, id, n, ttl, x)
				got, gotErr = s.Transfer(ctx, now, res, id, n, ttl, x)
				if wantErr == nil {
					transfers = append(transfers, x)
				}
			case op < 14:
				x, h, sess, lease := pick(transfers), newID("h"), sessions[rng.IntN(len(sessions))], dur(10)
				what = fmt.Sprintf("Seize(%s)", x)
				want, wantErr = copylog.Seize(st, now, x, h, sess, lease)
				got, gotErr = s.Seize(ctx, now, res, x, h, sess, lease)
				if wantErr == nil {
					holds = append(holds, h)
				}
			case op < 17:
				sess, id, lease := sessions[rng.IntN(len(sessions))], "", dur(10)
				if rng.IntN(2) == 0 {
					sess, id = "", pick(holds)
				}
				what = fmt.Sprintf("KeepAlive(%q, %q, %v)", sess, id, lease)
				want, wantErr = copylog.KeepAlive(st, now, sess, id, lease)
				got, gotErr = s.KeepAlive(ctx, now, res, sess, id, lease)
			case op < 19:
				sess := sessions[rng.IntN(len(sessions))]
				what = fmt.Sprintf("ReleaseSession(%s)", sess)
				want, wantErr = copylog.ReleaseSession(st, now, sess)
				got, gotErr = s.ReleaseSession(ctx, now, res, sess)
			default:
				what = "Reap"
				for _, n := range names {
					if _, err := copylog.Expire(ref[n], now); err != nil {
						t.Fatal(err)
					}
				}
				want, got = nil, nil
				gotErr = s.Reap(ctx, now)
			}
			if errClass(wantErr) != errClass(gotErr) {
				t.Fatalf("seed %d step %d at T0+%v: %s on %s: err = %v, want %v", seed, step, now.Sub(T0), what, res, gotErr, wantErr)
			}
			if diff := cmp.Diff(want, got, emptyOK); diff != "" {
				t.Fatalf("seed %d step %d at T0+%v: %s on %s (-copylog +store):\n%s", seed, step, now.Sub(T0), what, res, diff)
			}
			if wantErr != nil {
				seen[errClass(wantErr)]++
			}
			switch r := want.(type) {
			case copylog.Reservation:
				seen[fmt.Sprintf("reserve ok=%v replayed=%v", r.OK, r.Replayed)]++
				seen[fmt.Sprint("reaped ", r.Reaped.Holds > 0, r.Reaped.Transfers > 0)]++
			case copylog.KeepAliveResult:
				seen[fmt.Sprint("keep-alive ", r.Holds > 0)]++
			case copylog.SessionResult:
				seen[fmt.Sprint("session ", r.Holds > 0)]++
			}
		}
	}
	t.Logf("outcomes: %v", seen)
	for _, k := range []string{"reserve ok=true replayed=false", "reserve ok=false replayed=false", "reserve ok=true replayed=true",
		"reaped true false", "reaped false true", "keep-alive true", "session true", copylog.ErrUnknownHold.Error(),
		copylog.ErrUnknownTransfer.Error(), copylog.ErrOverRelease.Error(), copylog.ErrRequestIDReused.Error()} {
		if seen[k] == 0 {
			t.Errorf("the traces never saw %q: %v", k, seen)
		}
	}
}
