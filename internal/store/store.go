package store

import (
	"context"
	"errors"
	"hash/maphash"
	"time"

	"github.com/charonlimit/charon/tiers"
)

// ErrClosed is returned by Decide after Close.
var ErrClosed = errors.New("store: closed")

// ErrNotSent is returned (wrapped, with the context's error) by a remote
// store's Decide when the caller's context ended while the call waited in
// the store's own queue, before anything was sent: nothing was changed, and
// it says nothing about the remote's health.
var ErrNotSent = errors.New("store: not sent before the deadline")

// ErrStuck is returned (wrapped, with ErrNotSent and the context's error) by
// a remote store's Decide for a call that was not sent because everything
// that sends calls was waiting for the remote to answer calls sent before
// this one was queued: nothing was changed, and unlike a plain ErrNotSent it
// is evidence that the remote is not answering, as a timeout is (the caller
// waited its whole deadline behind the remote's silence).
var ErrStuck = errors.New("store: queued behind calls the remote has not answered")

// ErrReleased is returned (wrapped) by a remote store's Decide for a call
// its owner released (the Redis store's Release: the resilient wrapper's
// breaker opened while the call waited): the call stopped waiting for the
// remote, which may still apply it (as a call that times out); the remote
// store gives back what such a call was granted when the reply comes.
var ErrReleased = errors.New("store: released while waiting for the remote")

// ErrReplied is returned (wrapped) by a remote store's Decide when the remote
// answered the call with an error of its own about the call's data (a key
// holding something else, a script error on a state): the call failed, but
// the remote is up and answering.
var ErrReplied = errors.New("store: the remote answered with an error")

// ErrBadItem is returned (wrapped) by Decide for an item it cannot decide: no
// policy, hits below 1, or a minimum outside [1, hits]. Nothing is changed.
var ErrBadItem = errors.New("store: bad item")

// ErrCannotReserve is returned by a Reserver wrapping a store that is not
// one, or that cannot reserve at the moment.
var ErrCannotReserve = errors.New("store: cannot reserve")

// Key names the state of one (resource, domain) pair under policies of one
// shape. PolicyID is the policy's shape (tiers.Policy.Shape, Match.Shape):
// it does not change with the policy's limits, so that new limits apply to
// the counts already made (SPEC §3); a change of shape starts from fresh
// state and the old state expires. The global state of a resource (its
// hits over all domains, whatever their shapes) is keyed by Resource alone.
//
// Resource and Domain are escaped by their producer and safe as Redis key
// parts. A store must copy them if it keeps them past the call.
type Key struct {
	Resource string
	Domain   string
	PolicyID uint64
}

// Hash returns a hash of k under seed, for sharding in-process maps (the
// in-memory store's states, the over-limit cache).
func (k Key) Hash(seed maphash.Seed) uint64 {
	h := maphash.String(seed, k.Resource)
	h = h*0x9e3779b97f4a7c15 ^ maphash.String(seed, k.Domain)
	h ^= k.PolicyID * 0xbf58476d1ce4e5b9
	return h ^ h>>29
}

// Item is one descriptor of a request, ready to be decided.
type Item struct {
	Key Key
	// Policy is the effective policy of the pair; it must not be nil. Items
	// with the same Key must carry the same policy.
	Policy *tiers.Policy
	// Hits is the number of hits asked for (the copies), Min the number of
	// them that must be granted for the item to be granted (1 <= Min <=
	// Hits). An RLS request asks for Hits == Min: all or nothing. Hits 0
	// (with Min 0) is a check: granted, it reports the pair's state and
	// consumes nothing (beside a take of the same pair it is a member of
	// that group and gets the group's answer).
	Hits, Min int64
	// Refund gives Hits back (Envoy's is_negative_hits) instead of taking
	// them. Refunds always apply, whatever the other items' answers; Min is
	// ignored.
	Refund bool
	// SlotsAt names, for a refund of a concurrency limit
	// (tiers.Policy.Concurrency), the take whose slots it gives back: the
	// SlotsAt of that take's decision, on the store's clock
	// (tiers.RefundSlots). The zero Time gives back the oldest slots held
	// (tiers.Refund); other items ignore it.
	SlotsAt time.Time
	// Shadow marks an item that is decided and recorded but does not take
	// part in the request's all-or-nothing: its rejection does not stop the
	// other items from being committed (shadow mode, ignore_limits). A
	// shadow item is committed when it is granted and the request commits.
	Shadow bool
}

// Store keeps rate-limit state and decides requests against it.
//
// Implementations are safe for concurrent use.
type Store interface {
	// Decide decides items at now, as Apply describes, writing one decision
	// per item to out (len(out) >= len(items)). In short: every refund is
	// applied first; then, if every non-shadow, non-refund item would be
	// granted, all granted items are committed, else none is (a request
	// whose answer is over the limit consumes nothing). Items sharing a Key
	// are decided as one request of their summed hits; items sharing a
	// resource's global limit see each other's grants, in item order.
	//
	// Decide makes one round trip to each remote node that holds its keys
	// (a Redis Cluster call whose keys span masters sends one to each,
	// concurrently), and more only where a node asks for a retry (a slot
	// migrating) or to give back what a node granted for a call another
	// node rejected; a remote store documents its round trips. On error the
	// contents of out are unspecified; a store documents whether an error
	// can leave the call committed (a timed-out remote script may have run).
	Decide(ctx context.Context, now time.Time, items []Item, out []tiers.Decision) error
	// Close releases the store's resources; Decide fails with ErrClosed
	// afterwards. Close is idempotent.
	Close() error
}

// ErrCannotInspect is returned by an Inspector wrapping a store that is
// not one.
var ErrCannotInspect = errors.New("store: cannot inspect this store")

// Inspector is a Store that can show a pair's state without changing it and
// clear it: what an operator's explain and reset do. The memory and Redis
// stores implement it.
type Inspector interface {
	// Inspect returns the view at now of the state of it's pair (and of its
	// resource's global state when its policy has a global limit), as
	// tiers.Inspect computes it. Hits and Min are not read.
	Inspect(ctx context.Context, now time.Time, it *Item) (tiers.View, error)
	// Reset forgets the state of it's pair: its next request is decided
	// as the first. The resource's global state is kept (it is every
	// domain's).
	Reset(ctx context.Context, it *Item) error
}

// Reserver is a Store that can pace: decide now a request to be granted at
// a later instant, the request being held until then (package tiers,
// reserve.go, says how each algorithm reserves and why the limit then holds
// on the instants requests are answered at). The memory, Redis and
// resilient stores implement it.
type Reserver interface {
	// Reserve is Decide for the instant now+after (after >= 0), as
	// ApplyReserve describes: its takes are reserved for that instant,
	// which it returns on the store's clock (a store on another clock than
	// the caller's, Redis's own, reserves for its own now plus after).
	Reserve(ctx context.Context, now time.Time, after time.Duration, items []Item, out []tiers.Decision) (time.Time, error)
	// GiveBack gives back, at now, the reservation made for at (an instant
	// Reserve returned) of items, a paced request that stopped waiting:
	// ApplyReserve of items with Refund set.
	GiveBack(ctx context.Context, now, at time.Time, items []Item) error
}
