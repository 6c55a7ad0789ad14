package holds

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/charonlimit/charon/copylog"
	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/copystore"
)

// Errors of the copy operations; the server maps each to its own gRPC code.
var (
	// ErrRateLimited: a copy operation (Reserve) on a resource that is not
	// copy-limited.
	ErrRateLimited = errors.New("holds: resource is not copy-limited, use Request")
	// ErrNoCopyStore: a copy operation of a Broker without Options.Copies.
	ErrNoCopyStore = errors.New("holds: no copy store")
)

// Options configure a Broker. The zero value is usable: no copy store
// (every operation fails with ErrNoCopyStore), no tree, the system clock.
type Options struct {
	// Copies keeps the copy logs of copy-limited resources; nil: the
	// operations fail with ErrNoCopyStore. The Broker does not own it.
	Copies copystore.Store
	// Tree returns the descriptor tree in force, the RLS pipeline's
	// (engine.Engine.Tree); nil: nothing is copy-limited.
	Tree func() *descriptors.Tree
	// Now is the clock, read once per operation; nil means time.Now.
	Now func() time.Time
}

// Broker runs the copy operations of charon.v1 (Reserve, Release,
// Transfer, Seize, KeepAlive, sessions) over a copy store. Safe for
// concurrent use. Make one with New.
type Broker struct {
	copies copystore.Store
	tree   func() *descriptors.Tree
	now    func() time.Time
	// copyIdx is the index of the last tree seen (copyIndex).
	copyIdx atomic.Pointer[copyIndex]
}

// New returns a Broker with opts.
func New(opts Options) *Broker {
	b := &Broker{copies: opts.Copies, tree: opts.Tree, now: opts.Now}
	if b.tree == nil {
		b.tree = func() *descriptors.Tree { return nil }
	}
	if b.now == nil {
		b.now = time.Now
	}
	return b
}

// unconfiguredSuffix names, after an RLS domain's escaped name and "/", the
// one unlimited copy log that holds the reserves of resources matching
// nothing in a domain with allow_unconfigured. Escaping never leaves a "~"
// there in a configured resource, so the name cannot collide.
const unconfiguredSuffix = "/~unconfigured"

// unlimitedCopies is the copy limit of unconfigured resources.
var unlimitedCopies = &copylog.Config{DomainLimit: copylog.MaxCopies}

// copyIndex maps the copy-limited resources of one tree to their limits,
// converted to copylog once per tree.
type copyIndex struct {
	tree       *descriptors.Tree
	byResource map[string]*copyLimit
	// resources lists byResource's keys, sorted.
	resources []string
}

type copyLimit struct {
	limit *descriptors.Limit // nil for an unconfigured resource
	cfg   *copylog.Config
}

// copyIndex returns the index of the tree in force, building it on first
// use after the tree changed.
func (b *Broker) copyIndex() *copyIndex {
	tree := b.tree()
	if idx := b.copyIdx.Load(); idx != nil && idx.tree == tree {
		return idx
	}
	idx := &copyIndex{tree: tree, byResource: make(map[string]*copyLimit)}
	for _, dc := range tree.Domains() {
		if dc.AllowUnconfigured {
			idx.byResource[descriptors.Escape(dc.Name)+unconfiguredSuffix] = &copyLimit{cfg: unlimitedCopies}
		}
		for _, lf := range tree.Leaves(dc.Name) {
			if lf.Limit.Copies != nil {
				idx.byResource[lf.Resource] = &copyLimit{limit: lf.Limit, cfg: CopyConfig(lf.Limit.Copies)}
			}
		}
	}
	for r := range idx.byResource {
		idx.resources = append(idx.resources, r)
	}
	slices.Sort(idx.resources)
	b.copyIdx.Store(idx)
	return idx
}

// CopyConfig converts a configured copy limit to copylog's.
func CopyConfig(c *descriptors.Copies) *copylog.Config {
	cfg := &copylog.Config{DomainLimit: c.DomainLimit, GlobalLimit: c.GlobalLimit, Overrides: c.Overrides}
	for _, g := range c.Groups {
		cfg.Groups = append(cfg.Groups, copylog.Group{Name: g.Name, Limit: g.Limit, Members: g.Members})
	}
	return cfg
}

// CopyResources lists the copy-limited resources of the configuration in
// force (with each allow_unconfigured domain's unlimited copy log), sorted.
// The caller must not change the slice.
func (b *Broker) CopyResources() []string {
	return b.copyIndex().resources
}

// ReserveRequest is a charon.v1 Reserve, resolved by the Broker.
type ReserveRequest struct {
	// Domain and Entries address the resource as an RLS descriptor does.
	Domain  string
	Entries []descriptors.Entry
	// Copies in [1, copylog.MaxCopies]; Min in [0, Copies], 0 meaning 1.
	Copies, Min int64
	// RequestID makes the reserve idempotent ("": not).
	RequestID string
	// Session binds the hold ("": none, it lives by Lease alone).
	Session string
	// Lease in [MinLease, copylog.MaxLease].
	Lease time.Duration
}

// Reservation is the answer to Reserve.
type Reservation struct {
	copylog.Reservation
	// Resource is the copy log's resource; Domain the Charon domain.
	Resource, Domain string
}

// Reserve reserves copies of the copy-limited resource the request's
// descriptor matches, under a new hold id (NewID of the resource). Errors:
// *descriptors.InputError, descriptors.ErrUnknownResource, ErrRateLimited,
// ErrNoCopyStore, the store's (copylog's sentinels, or
// copystore.ErrUnavailable), each wrapped in a *descriptors.FieldError naming
// the request field.
func (b *Broker) Reserve(ctx context.Context, r ReserveRequest) (Reservation, error) {
	if err := descriptors.ValidateResource(r.Domain, r.Entries); err != nil {
		return Reservation{}, err
	}
	if err := cmp.Or(checkCopies(r.Copies, 1), checkMin(r.Min, r.Copies), checkLease("lease", r.Lease)); err != nil {
		return Reservation{}, err
	}
	if b.copies == nil {
		return Reservation{}, ErrNoCopyStore
	}
	idx := b.copyIndex()
	tree := idx.tree
	var resource, domain string
	var cl *copyLimit
	m, ok := tree.Match(r.Domain, r.Entries)
	switch {
	case !ok:
		dc, known := tree.Domain(r.Domain)
		if !known || !dc.AllowUnconfigured {
			return Reservation{}, &descriptors.FieldError{Field: "resource", Err: fmt.Errorf("%w: no limit matches domain %q and its entries", descriptors.ErrUnknownResource, descriptors.Truncate(r.Domain))}
		}
		resource = descriptors.Escape(r.Domain) + unconfiguredSuffix
		cl = idx.byResource[resource]
	case m.Limit.Copies == nil:
		return Reservation{}, &descriptors.FieldError{Field: "resource", Err: fmt.Errorf("%w: %s", ErrRateLimited, m.Resource)}
	default:
		resource, domain = m.Resource, m.Domain
		cl = idx.byResource[resource]
	}
	if cl == nil {
		// The index and the match come from the same tree: unreachable.
		return Reservation{}, fmt.Errorf("holds: no copy limit indexed for %s", resource)
	}
	holdID, err := mintID(resource, "hold")
	if err != nil {
		return Reservation{}, err
	}
	res, err := b.copies.Reserve(ctx, b.now(), resource, cl.cfg, copylog.ReserveRequest{
		Domain: domain, Copies: r.Copies, Min: r.Min, HoldID: holdID,
		RequestID: r.RequestID, Session: r.Session, Lease: r.Lease,
	})
	out := Reservation{Reservation: res, Resource: resource, Domain: domain}
	if err != nil {
		return out, fieldOf(err, "request_id")
	}
	return out, nil
}

// fieldOf attributes a copy store error to the request field it is about;
// idField names the field of ErrBadID and of unknown ids.
func fieldOf(err error, idField string) error {
	var field string
	switch {
	case errors.Is(err, copylog.ErrBadCopies), errors.Is(err, copylog.ErrOverRelease), errors.Is(err, copylog.ErrOverTransfer):
		field = "copies"
	case errors.Is(err, copylog.ErrBadMin):
		field = "min_copies"
	case errors.Is(err, copylog.ErrBadLease):
		field = "lease"
	case errors.Is(err, copylog.ErrRequestIDReused):
		field = "request_id"
	case errors.Is(err, copylog.ErrBadID), errors.Is(err, copylog.ErrUnknownHold), errors.Is(err, copylog.ErrUnknownTransfer):
		field = idField
	default:
		return err
	}
	return &descriptors.FieldError{Field: field, Err: err}
}

// checkCopies returns the *descriptors.InputError of copies outside [lo,
// copylog.MaxCopies].
func checkCopies(copies, lo int64) error {
	if copies < lo || copies > copylog.MaxCopies {
		return &descriptors.InputError{Field: "copies", Message: fmt.Sprintf("%d, want in [%d, %d]", copies, lo, copylog.MaxCopies)}
	}
	return nil
}

// checkMin returns the *descriptors.InputError of a min_copies outside [0, copies].
func checkMin(minCopies, copies int64) error {
	if minCopies < 0 || minCopies > copies {
		return &descriptors.InputError{Field: "min_copies", Message: fmt.Sprintf("%d, want in [0, copies %d]", minCopies, copies)}
	}
	return nil
}

// MinLease is the shortest lease or transfer ttl: copylog keeps time in
// microseconds and refuses a shorter one with copylog.ErrBadLease, which
// names no request field.
const MinLease = time.Microsecond

// checkLease returns the *descriptors.InputError of a lease (or ttl, as field names
// it) outside [MinLease, copylog.MaxLease].
func checkLease(field string, lease time.Duration) error {
	if lease < MinLease || lease > copylog.MaxLease {
		return &descriptors.InputError{Field: field, Message: fmt.Sprintf("%v, want in [%v, %v]", lease, MinLease, copylog.MaxLease)}
	}
	return nil
}

// mintID mints the id of a new hold or transfer (what) of resource.
func mintID(resource, what string) (string, error) {
	id, err := NewID(resource)
	if err != nil {
		return "", fmt.Errorf("%w: minting a %s id: %w", copystore.ErrUnavailable, what, err)
	}
	return id, nil
}

// resourceOfID begins an operation on a hold or transfer id, named field
// in the request: it returns the id's resource, or the first error of an
// id this service did not issue (wrapping unknown, copylog.ErrUnknownHold
// or ErrUnknownTransfer), of checks (the operation's other arguments) and
// of a missing copy store.
func (b *Broker) resourceOfID(id, field string, unknown error, checks ...error) (string, error) {
	if id == "" {
		return "", &descriptors.InputError{Field: field, Message: "empty"}
	}
	if len(id) > copylog.MaxIDLen {
		return "", &descriptors.InputError{Field: field, Message: fmt.Sprintf("%d bytes, longer than %d", len(id), copylog.MaxIDLen)}
	}
	r, ok := ResourceOf(id)
	if !ok {
		return "", &descriptors.FieldError{Field: field, Err: fmt.Errorf("%w: %q is not an id this service issued", unknown, descriptors.Truncate(id))}
	}
	if err := cmp.Or(checks...); err != nil {
		return "", err
	}
	if b.copies == nil {
		return "", ErrNoCopyStore
	}
	return r, nil
}

// mintOnID is resourceOfID that also mints the id of a new hold or
// transfer (what) of the resource.
func (b *Broker) mintOnID(what, id, field string, unknown error, checks ...error) (resource, newID string, err error) {
	if resource, err = b.resourceOfID(id, field, unknown, checks...); err != nil {
		return "", "", err
	}
	newID, err = mintID(resource, what)
	return resource, newID, err
}

// Release gives back copies of the hold (0: all it has). Errors: the hold
// unknown (copylog.ErrUnknownHold, field hold_id), more than it has
// (copylog.ErrOverRelease, field copies), a store failure.
func (b *Broker) Release(ctx context.Context, holdID string, copies int64) (copylog.ReleaseResult, error) {
	resource, err := b.resourceOfID(holdID, "hold_id", copylog.ErrUnknownHold, checkCopies(copies, 0))
	if err != nil {
		return copylog.ReleaseResult{}, err
	}
	res, err := b.copies.Release(ctx, b.now(), resource, holdID, copies)
	return res, fieldOf(err, "hold_id")
}

// Transferred is the answer to Transfer.
type Transferred struct {
	copylog.TransferResult
	Resource string
}

// Transfer stages copies of the hold (0: all) under a new transfer id for
// ttl. Errors as Release, with copylog.ErrOverTransfer.
func (b *Broker) Transfer(ctx context.Context, holdID string, copies int64, ttl time.Duration) (Transferred, error) {
	resource, transferID, err := b.mintOnID("transfer", holdID, "hold_id", copylog.ErrUnknownHold, checkCopies(copies, 0), checkLease("ttl", ttl))
	if err != nil {
		return Transferred{}, err
	}
	res, err := b.copies.Transfer(ctx, b.now(), resource, holdID, copies, ttl, transferID)
	return Transferred{TransferResult: res, Resource: resource}, fieldOf(err, "hold_id")
}

// Seized is the answer to Seize.
type Seized struct {
	copylog.SeizeResult
	Resource string
	// CurrentGroups are the groups the hold's domain belongs to in the
	// configuration in force (Groups are those captured at reserve time).
	CurrentGroups []string
}

// Seize turns the staged copies of transferID into a new hold of session
// (or of its lease alone). Errors: copylog.ErrUnknownTransfer (unknown,
// lapsed or already seized; field transfer_id), a store failure.
func (b *Broker) Seize(ctx context.Context, transferID, session string, lease time.Duration) (Seized, error) {
	resource, holdID, err := b.mintOnID("hold", transferID, "transfer_id", copylog.ErrUnknownTransfer, checkLease("lease", lease))
	if err != nil {
		return Seized{}, err
	}
	res, err := b.copies.Seize(ctx, b.now(), resource, transferID, holdID, session, lease)
	out := Seized{SeizeResult: res, Resource: resource}
	if err != nil {
		return out, fieldOf(err, "transfer_id")
	}
	if cl := b.copyIndex().byResource[resource]; cl != nil {
		for _, g := range cl.cfg.Groups {
			if slices.Contains(g.Members, res.Domain) {
				out.CurrentGroups = append(out.CurrentGroups, g.Name)
			}
		}
	}
	return out, nil
}

// KeepAlive extends the lease of one hold to now+lease (never shortening
// it). Errors as Release.
func (b *Broker) KeepAlive(ctx context.Context, holdID string, lease time.Duration) (copylog.KeepAliveResult, error) {
	resource, err := b.resourceOfID(holdID, "hold_id", copylog.ErrUnknownHold, checkLease("lease", lease))
	if err != nil {
		return copylog.KeepAliveResult{}, err
	}
	res, err := b.copies.KeepAlive(ctx, b.now(), resource, "", holdID, lease)
	return res, fieldOf(err, "hold_id")
}

// KeepAliveSession extends the leases of every hold of session on the
// given resources (nil: every copy-limited resource of the configuration,
// CopyResources), and sums the answers: Holds kept alive, the earliest
// expiry, what reaping released. It stops at the first error.
func (b *Broker) KeepAliveSession(ctx context.Context, session string, lease time.Duration, resources []string) (copylog.KeepAliveResult, error) {
	if session == "" {
		return copylog.KeepAliveResult{}, &descriptors.InputError{Field: "session", Message: "empty"}
	}
	if err := checkLease("lease", lease); err != nil {
		return copylog.KeepAliveResult{}, err
	}
	if b.copies == nil {
		return copylog.KeepAliveResult{}, ErrNoCopyStore
	}
	if resources == nil {
		resources = b.CopyResources()
	}
	var out copylog.KeepAliveResult
	now := b.now()
	for _, r := range resources {
		res, err := b.copies.KeepAlive(ctx, now, r, session, "", lease)
		if err != nil {
			return out, fieldOf(err, "session")
		}
		out.Reaped.Holds += res.Reaped.Holds
		out.Reaped.Transfers += res.Reaped.Transfers
		out.Reaped.Copies += res.Reaped.Copies
		if res.Holds > 0 {
			if out.Holds == 0 || res.Expires.Before(out.Expires) {
				out.Expires = res.Expires
			}
			out.Holds += res.Holds
		}
	}
	return out, nil
}

// ReleaseSession releases every hold of session on resource, as when the
// session's stream ends.
func (b *Broker) ReleaseSession(ctx context.Context, resource, session string) (copylog.SessionResult, error) {
	if b.copies == nil {
		return copylog.SessionResult{}, ErrNoCopyStore
	}
	res, err := b.copies.ReleaseSession(ctx, b.now(), resource, session)
	return res, fieldOf(err, "session")
}
