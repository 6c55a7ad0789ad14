package rediscopy

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/charonlimit/charon/copylog"
	"github.com/charonlimit/charon/internal/copystore"
	"github.com/charonlimit/charon/internal/redisfunc"
)

//go:embed copies.lua
var copiesLua string

// The copy log function is a Redis 7 function library named after a hash of
// its code, so that processes of different versions sharing one Redis each
// call their own code.
var (
	lib      = redisfunc.New(copiesLua)
	funcName = lib.Function("charon_copies_")
)

// Load loads the copy log function into Redis (every master of a Cluster).
// Operations load it by themselves when Redis answers that it does not have
// it; calling Load at start only moves that round trip out of the first
// operation.
func (s *Store) Load(ctx context.Context) error {
	if err := lib.Load(ctx, s.c); err != nil {
		return fmt.Errorf("%w: %v", copystore.ErrUnavailable, err)
	}
	return nil
}

// reply is the function's answer: an error code, what reaping released,
// the instant it decided at (µs) and the operation's fields.
type reply struct {
	code   string
	reaped copylog.Reaped
	t      int64
	f      []any
}

// refusal returns the error an operation answers with when the function
// refuses it with code (worded as copylog words the same refusal; f is the
// reply's fields), or nil for a code the operation never answers with.
type refusal func(code string, f []any) error

// call runs operation op on resource's copy log in one FCALL (two when the
// function must be loaded first). When the function refuses the operation,
// call returns the reply (what reaping released still counts) with refuse's
// error; a code refuse does not know (refuse may be nil) is an unexpected
// answer.
func (s *Store) call(ctx context.Context, now time.Time, resource, op string, refuse refusal, args ...any) (reply, error) {
	select {
	case <-s.closed:
		return reply{}, ErrClosed
	default:
	}
	at := ""
	if s.clock == redisfunc.ClockCaller {
		at = strconv.FormatInt(now.UnixMicro(), 10)
	}
	argv := append([]any{op, at}, args...)
	keys := []string{s.key(resource)}
	var v any
	err := lib.Run(ctx, s.c, func() (err error) {
		if op != "reserve" && op != "seize" && op != "transfer" {
			v, err = s.c.FCall(ctx, funcName, keys, argv...).Result()
			return err
		}
		// An operation that can leave holds or transfers indexes its
		// resource for the reaper first, in the same round trip (a
		// superset of the logs with holds is all the reaper needs).
		pipe := s.c.Pipeline()
		idx := pipe.ZIncrBy(ctx, s.indexKey(), 1, resource)
		ttl := pipe.PExpire(ctx, s.indexKey(), indexTTL)
		cmd := pipe.FCall(ctx, funcName, keys, argv...)
		_, _ = pipe.Exec(ctx) // each command's error is read below
		if v, err = cmd.Result(); err != nil {
			return err
		}
		if idx.Err() != nil || ttl.Err() != nil {
			// The operation ran, unindexed (on a Cluster the index is on
			// another master): index it again, and count a second failure.
			if err := s.index(ctx, resource); err != nil {
				s.indexFailed.Add(1)
			}
		}
		return nil
	})
	if err != nil {
		return reply{}, fmt.Errorf("%w: %s: %v", copystore.ErrUnavailable, resource, err)
	}
	a, ok := v.([]any)
	if !ok || len(a) != 6 {
		return reply{}, fmt.Errorf("%w: %s: malformed reply %v", copystore.ErrUnavailable, resource, v)
	}
	var r reply
	r.code, _ = a[0].(string)
	r.reaped = copylog.Reaped{Holds: int(num(a[1])), Transfers: int(num(a[2])), Copies: num(a[3])}
	r.t = num(a[4])
	r.f, _ = a[5].([]any)
	if r.code == "" {
		return r, nil
	}
	if refuse != nil {
		if err := refuse(r.code, r.f); err != nil {
			return r, err
		}
	}
	return reply{}, fmt.Errorf("%w: %s: unexpected answer %q", copystore.ErrUnavailable, resource, r.code)
}

func num(v any) int64 {
	n, _ := v.(int64)
	return n
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

// strs is an array of strings, nil when empty (as copylog answers).
func strs(v any) []string {
	a, _ := v.([]any)
	if len(a) == 0 {
		return nil
	}
	out := make([]string, len(a))
	for i, x := range a {
		out[i] = str(x)
	}
	return out
}

// field returns f[i], or nil past its end.
func field(f []any, i int) any {
	if i < len(f) {
		return f[i]
	}
	return nil
}

// errArgs reports whether err is one of copylog's argument errors (found
// before the state is read).
func errArgs(err error) bool {
	for _, e := range [...]error{copylog.ErrNilState, copylog.ErrBadConfig, copylog.ErrBadCopies,
		copylog.ErrBadMin, copylog.ErrBadLease, copylog.ErrBadID} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func reserveFCall(s *Store, ctx context.Context, now time.Time, resource string, cfg *copylog.Config, r copylog.ReserveRequest) (copylog.Reservation, error) {
	// copylog checks the arguments before it reads the state: the same
	// operation on an empty State finds exactly the same argument errors.
	if _, err := copylog.Reserve(cfg, &copylog.State{}, now, r); err != nil {
		return copylog.Reservation{}, err
	}
	min := r.Min
	if min == 0 {
		min = 1
	}
	dl := cfg.DomainLimit
	if v, ok := cfg.Overrides[r.Domain]; ok {
		dl = v
	}
	args := []any{r.Domain, r.Copies, min, r.HoldID, r.RequestID, r.Session, r.Lease.Microseconds(), dl, cfg.GlobalLimit}
	var groups []copylog.Group
	for _, g := range cfg.Groups {
		for _, m := range g.Members {
			if m == r.Domain {
				groups = append(groups, g)
				args = append(args, g.Name, g.Limit)
				break
			}
		}
	}
	rep, err := s.call(ctx, now, resource, "reserve", func(code string, _ []any) error {
		switch code {
		case "request_id_reused":
			return fmt.Errorf("%w: request id %q", copylog.ErrRequestIDReused, r.RequestID)
		case "hold_exists":
			return fmt.Errorf("%w: %q", copylog.ErrHoldExists, r.HoldID)
		}
		return nil
	}, args...)
	if err != nil {
		return copylog.Reservation{Reaped: rep.reaped}, err
	}
	f := rep.f
	out := copylog.Reservation{
		OK:              num(field(f, 0)) == 1,
		Granted:         num(field(f, 1)),
		HoldID:          str(field(f, 2)),
		Token:           num(field(f, 3)),
		Groups:          strs(field(f, 5)),
		Replayed:        num(field(f, 6)) >= 1,
		HoldGone:        num(field(f, 6)) == 2,
		LimitedByDomain: num(field(f, 7)) == 1,
		LimitedByGlobal: num(field(f, 8)) == 1,
		LimitedByGroup:  str(field(f, 9)),
		Reaped:          rep.reaped,
	}
	if out.OK {
		out.Expires = time.UnixMicro(num(field(f, 4)))
	}
	out.Context = copylog.Context{DomainLimit: dl, GlobalLimit: cfg.GlobalLimit,
		DomainHeld: num(field(f, 10)), TotalHeld: num(field(f, 11))}
	held, _ := field(f, 12).([]any)
	for i, g := range groups {
		out.Context.Groups = append(out.Context.Groups, copylog.GroupContext{Name: g.Name, Limit: g.Limit, Held: num(field(held, i))})
	}
	return out, nil
}

func releaseFCall(s *Store, ctx context.Context, now time.Time, resource, holdID string, copies int64) (copylog.ReleaseResult, error) {
	if _, err := copylog.Release(&copylog.State{}, now, holdID, copies); errArgs(err) {
		return copylog.ReleaseResult{}, err
	}
	rep, err := s.call(ctx, now, resource, "release", func(code string, f []any) error {
		if code == "over_release" {
			return fmt.Errorf("%w: release of %d copies, hold %q has %d", copylog.ErrOverRelease, copies, holdID, num(field(f, 0)))
		}
		return unknownHold(code, holdID)
	}, holdID, copies)
	if err != nil {
		return copylog.ReleaseResult{Reaped: rep.reaped}, err
	}
	f := rep.f
	return copylog.ReleaseResult{Released: num(field(f, 0)), Left: num(field(f, 1)), Domain: str(field(f, 2)),
		DomainHeld: num(field(f, 3)), TotalHeld: num(field(f, 4)), Reaped: rep.reaped}, nil
}

func transferFCall(s *Store, ctx context.Context, now time.Time, resource, holdID string, copies int64, ttl time.Duration, transferID string) (copylog.TransferResult, error) {
	if _, err := copylog.Transfer(&copylog.State{}, now, holdID, copies, ttl, transferID); errArgs(err) {
		return copylog.TransferResult{}, err
	}
	rep, err := s.call(ctx, now, resource, "transfer", func(code string, f []any) error {
		switch code {
		case "over_transfer":
			return fmt.Errorf("%w: transfer of %d copies, hold %q has %d", copylog.ErrOverTransfer, copies, holdID, num(field(f, 0)))
		case "transfer_exists":
			return fmt.Errorf("%w: %q", copylog.ErrTransferExists, transferID)
		}
		return unknownHold(code, holdID)
	}, holdID, copies, ttl.Microseconds(), transferID)
	if err != nil {
		return copylog.TransferResult{Reaped: rep.reaped}, err
	}
	f := rep.f
	return copylog.TransferResult{TransferID: transferID, Copies: num(field(f, 0)), Left: num(field(f, 1)),
		Expires: time.UnixMicro(num(field(f, 2))), Reaped: rep.reaped}, nil
}

func seizeFCall(s *Store, ctx context.Context, now time.Time, resource, transferID, holdID, session string, lease time.Duration) (copylog.SeizeResult, error) {
	if _, err := copylog.Seize(&copylog.State{}, now, transferID, holdID, session, lease); errArgs(err) {
		return copylog.SeizeResult{}, err
	}
	rep, err := s.call(ctx, now, resource, "seize", func(code string, _ []any) error {
		switch code {
		case "unknown_transfer":
			return fmt.Errorf("%w: %q", copylog.ErrUnknownTransfer, transferID)
		case "hold_exists":
			return fmt.Errorf("%w: %q", copylog.ErrHoldExists, holdID)
		}
		return nil
	}, transferID, holdID, session, lease.Microseconds())
	if err != nil {
		return copylog.SeizeResult{Reaped: rep.reaped}, err
	}
	f := rep.f
	return copylog.SeizeResult{HoldID: holdID, Copies: num(field(f, 0)), Token: num(field(f, 1)),
		Expires: time.UnixMicro(num(field(f, 2))), Domain: str(field(f, 3)), Groups: strs(field(f, 4)), Reaped: rep.reaped}, nil
}

func keepAliveFCall(s *Store, ctx context.Context, now time.Time, resource, session, holdID string, lease time.Duration) (copylog.KeepAliveResult, error) {
	if _, err := copylog.KeepAlive(&copylog.State{}, now, session, holdID, lease); errArgs(err) {
		return copylog.KeepAliveResult{}, err
	}
	rep, err := s.call(ctx, now, resource, "keepalive", func(code string, _ []any) error {
		return unknownHold(code, holdID)
	}, session, holdID, lease.Microseconds())
	out := copylog.KeepAliveResult{Reaped: rep.reaped}
	if err != nil {
		return out, err
	}
	out.Holds = int(num(field(rep.f, 0)))
	if out.Holds > 0 {
		out.Expires = time.UnixMicro(num(field(rep.f, 1)))
	}
	return out, nil
}

func releaseSessionFCall(s *Store, ctx context.Context, now time.Time, resource, session string) (copylog.SessionResult, error) {
	if _, err := copylog.ReleaseSession(&copylog.State{}, now, session); err != nil {
		return copylog.SessionResult{}, err
	}
	rep, err := s.call(ctx, now, resource, "session", nil, session)
	if err != nil {
		return copylog.SessionResult{}, err
	}
	return copylog.SessionResult{Holds: int(num(field(rep.f, 0))), Copies: num(field(rep.f, 1)), Reaped: rep.reaped}, nil
}

func expireFCall(s *Store, ctx context.Context, now time.Time, resource string) (copylog.Reaped, Live, error) {
	rep, err := s.call(ctx, now, resource, "expire", nil)
	if err != nil {
		return copylog.Reaped{}, Live{}, err
	}
	return rep.reaped, Live{Holds: int(num(field(rep.f, 0))), Transfers: int(num(field(rep.f, 1))), Copies: num(field(rep.f, 2))}, nil
}

// unknownHold is the error of the refusal "unknown_hold" of an operation on
// hold holdID, and nil for any other code.
func unknownHold(code, holdID string) error {
	if code != "unknown_hold" {
		return nil
	}
	return fmt.Errorf("%w: %q", copylog.ErrUnknownHold, holdID)
}

// index adds resource to the reaper's index, in its own round trip.
func (s *Store) index(ctx context.Context, resource string) error {
	pipe := s.c.Pipeline()
	pipe.ZIncrBy(ctx, s.indexKey(), 1, resource)
	pipe.PExpire(ctx, s.indexKey(), indexTTL)
	_, err := pipe.Exec(ctx)
	return err
}
