// Package copystore is the contract of the stores that keep the copy logs of
// copy-limited resources (SPEC §4): one copylog.State per resource, changed
// only through the copylog operations, atomically per resource.
package copystore

import (
	"context"
	"errors"
	"time"

	"github.com/charonlimit/charon/copylog"
)

// ErrUnavailable wraps every failure of the store itself (not of the
// operation): the caller answers gRPC UNAVAILABLE and never falls back to
// local state, which would grant the same copy twice.
var ErrUnavailable = errors.New("copystore: unavailable")

// Store keeps one copy log per resource. Resource is an escaped resource
// identity (descriptors.Match.Resource), safe as a Redis key part. Every
// method runs the copylog operation of the same name atomically on that
// resource's state at now (a Redis store may use Redis TIME instead, see its
// documentation), reaping lapsed holds first, and returns copylog's result
// and errors unchanged (errors.Is works with copylog's sentinels); a failure
// of the store wraps ErrUnavailable. A config change does not reset a
// resource's state: cfg is passed with every Reserve.
//
// Implementations are safe for concurrent use.
type Store interface {
	Reserve(ctx context.Context, now time.Time, resource string, cfg *copylog.Config, r copylog.ReserveRequest) (copylog.Reservation, error)
	Release(ctx context.Context, now time.Time, resource, holdID string, copies int64) (copylog.ReleaseResult, error)
	Transfer(ctx context.Context, now time.Time, resource, holdID string, copies int64, ttl time.Duration, transferID string) (copylog.TransferResult, error)
	Seize(ctx context.Context, now time.Time, resource, transferID, holdID, session string, lease time.Duration) (copylog.SeizeResult, error)
	KeepAlive(ctx context.Context, now time.Time, resource, session, holdID string, lease time.Duration) (copylog.KeepAliveResult, error)
	ReleaseSession(ctx context.Context, now time.Time, resource, session string) (copylog.SessionResult, error)
	// Reap expires lapsed holds and unseized transfers of every resource
	// (the periodic reaper; operations also reap their own resource).
	Reap(ctx context.Context, now time.Time) error
	Close() error
}
