package copylog

import (
	"fmt"
	"time"
)

// Reaped counts what an operation's reaping released: holds whose lease
// lapsed, staged transfers whose ttl lapsed, and their copies.
type Reaped struct {
	Holds     int
	Transfers int
	Copies    int64
}

// GroupContext is one group the domain belongs to, with its pool.
type GroupContext struct {
	Name  string
	Limit int64
	// Held is the copies held in the group's pool after the decision.
	Held int64
}

// Context is the decision context of a reserve (paper §3.1), after the
// decision.
type Context struct {
	// DomainLimit is the domain's limit (its override if any).
	DomainLimit int64
	// GlobalLimit is the resource's global limit (0: none).
	GlobalLimit int64
	// DomainHeld is the copies held by the domain, TotalHeld by all domains.
	DomainHeld int64
	TotalHeld  int64
	// Groups are the groups the domain belongs to now, in config order.
	Groups []GroupContext
}

// ReserveRequest is a reserve of Copies copies of which at least Min must be
// granted, for Domain.
type ReserveRequest struct {
	Domain string
	// Copies in [1, MaxCopies]; Min in [0, Copies], 0 meaning 1.
	Copies, Min int64
	// HoldID names the new hold: unique within the State, chosen by the
	// caller (a store passes at least 128 random bits, so holds cannot be
	// guessed and ids never repeat when a State is dropped and made again).
	HoldID string
	// RequestID makes the reserve idempotent: while its record lives, a
	// reserve with the same RequestID answers the first one's grant ("":
	// none).
	RequestID string
	// Session binds the hold ("": no session; the hold lives by its lease).
	Session string
	// Lease in (0, MaxLease]: the hold lapses at now+Lease unless kept alive.
	Lease time.Duration
}

// Reservation is the answer to a reserve. The zero value is a rejection.
type Reservation struct {
	// OK reports a grant of Granted copies (>= min) as hold HoldID with
	// fencing token Token, lapsing at Expires. On rejection Granted is 0.
	OK      bool
	Granted int64
	HoldID  string
	Token   int64
	Expires time.Time
	// Groups are the names of the groups the hold counts against.
	Groups []string
	// Replayed reports the answer of an earlier reserve with the same
	// request id: no new copies were granted. While the first grant's hold
	// lives, OK, Granted (of the first grant; the hold may have given some
	// back since), HoldID and Token are the first answer's.
	Replayed bool
	// HoldGone, with Replayed, reports that the first grant's hold no
	// longer exists (released, transferred or lapsed): OK is false and
	// Granted 0; HoldID and Token name the hold that was.
	HoldGone bool
	// LimitedByDomain, LimitedByGlobal and LimitedByGroup (a group's name)
	// tell which limit stopped the grant below Copies: the first of domain,
	// global, groups in config order that allowed the fewest copies.
	LimitedByDomain bool
	LimitedByGlobal bool
	LimitedByGroup  string
	Context         Context
	Reaped          Reaped
}

// Reserve grants the largest n in [max(Min, 1), Copies] that keeps the
// domain's copies within its domain limit, all copies within the global
// limit, and each pool of a group the domain belongs to within the group's
// limit, as one new hold; or nothing. See the package documentation.
//
// Argument errors (ErrBadConfig, ErrBadCopies, ErrBadMin, ErrBadLease,
// ErrBadID) change nothing; a rejection, ErrHoldExists and
// ErrRequestIDReused change nothing but the reaping of lapsed holds.
func Reserve(cfg *Config, s *State, now time.Time, r ReserveRequest) (Reservation, error) {
	if s == nil {
		return Reservation{}, ErrNilState
	}
	if err := cfg.Validate(); err != nil {
		return Reservation{}, err
	}
	if r.Copies < 1 || r.Copies > MaxCopies {
		return Reservation{}, fmt.Errorf("%w: copies %d not in [1, %d]", ErrBadCopies, r.Copies, MaxCopies)
	}
	if r.Min < 0 || r.Min > r.Copies {
		return Reservation{}, fmt.Errorf("%w: min copies %d not in [0, copies %d]", ErrBadMin, r.Min, r.Copies)
	}
	if err := checkArgs(r.Lease, "lease", idArg{r.HoldID, "hold id", false}, idArg{r.RequestID, "request id", true},
		idArg{r.Session, "session", true}, idArg{r.Domain, "domain", true}); err != nil {
		return Reservation{}, err
	}
	min := r.Min
	if min == 0 {
		min = 1
	}
	s.init()
	t := now.UnixMicro()
	out := Reservation{Reaped: s.reap(t)}
	exp := t + r.Lease.Microseconds()

	if r.RequestID != "" {
		if rec := s.records[r.RequestID]; rec != nil {
			if rec.domain != r.Domain {
				return Reservation{Reaped: out.Reaped}, fmt.Errorf("%w: request id %q", ErrRequestIDReused, r.RequestID)
			}
			if exp > rec.expires {
				rec.expires = exp
				s.lower(exp)
			}
			out.HoldID, out.Token, out.Replayed = rec.holdID, rec.token, true
			out.Groups = clone(rec.groups)
			if h := s.holds[rec.holdID]; h != nil {
				// The retry comes from the client that holds it: rebind and
				// refresh as a keep-alive would.
				if h.session != r.Session {
					s.rebind(h, r.Session)
				}
				if exp > h.expires {
					h.expires = exp
				}
				out.OK, out.Granted, out.Expires = true, rec.granted, time.UnixMicro(h.expires)
			} else {
				// The first grant's hold was released, transferred away or
				// lapsed: the retry must not believe it holds copies.
				out.HoldGone = true
			}
			out.Context = s.context(cfg, r.Domain)
			return out, nil
		}
	}
	if _, dup := s.holds[r.HoldID]; dup {
		return Reservation{Reaped: out.Reaped}, fmt.Errorf("%w: %q", ErrHoldExists, r.HoldID)
	}

	// n is the fewest copies any limit still allows.
	n := r.Copies
	if free := cfg.domainLimit(r.Domain) - s.domains[r.Domain]; free < n {
		n = max(free, 0)
		out.LimitedByDomain = true
	}
	if cfg.GlobalLimit > 0 {
		if free := cfg.GlobalLimit - s.total; free < n {
			n = max(free, 0)
			out.LimitedByDomain, out.LimitedByGlobal = false, true
		}
	}
	var groups []string
	for i := range cfg.Groups {
		g := &cfg.Groups[i]
		if !g.member(r.Domain) {
			continue
		}
		groups = append(groups, g.Name)
		if free := g.Limit - s.groups[g.Name]; free < n {
			n = max(free, 0)
			out.LimitedByDomain, out.LimitedByGlobal, out.LimitedByGroup = false, false, g.Name
		}
	}
	if n < min {
		out.Context = s.context(cfg, r.Domain)
		return Reservation{LimitedByDomain: out.LimitedByDomain, LimitedByGlobal: out.LimitedByGlobal,
			LimitedByGroup: out.LimitedByGroup, Context: out.Context, Reaped: out.Reaped}, nil
	}
	s.token++
	h := &hold{id: r.HoldID, domain: r.Domain, session: r.Session, requestID: r.RequestID,
		copies: n, groups: groups, token: s.token, expires: exp}
	s.putHold(h)
	s.add(r.Domain, groups, n)
	if r.RequestID != "" {
		s.records[r.RequestID] = &record{holdID: h.id, domain: r.Domain, granted: n, token: h.token,
			groups: groups, expires: exp}
	}
	out.OK, out.Granted, out.HoldID, out.Token = true, n, h.id, h.token
	out.Expires = time.UnixMicro(exp)
	out.Groups = clone(groups)
	out.Context = s.context(cfg, r.Domain)
	return out, nil
}

// context is the decision context of domain d under cfg.
func (s *State) context(cfg *Config, d string) Context {
	c := Context{DomainLimit: cfg.domainLimit(d), GlobalLimit: cfg.GlobalLimit,
		DomainHeld: s.domains[d], TotalHeld: s.total}
	for i := range cfg.Groups {
		g := &cfg.Groups[i]
		if g.member(d) {
			c.Groups = append(c.Groups, GroupContext{Name: g.Name, Limit: g.Limit, Held: s.groups[g.Name]})
		}
	}
	return c
}

// ReleaseResult is the answer to a release.
type ReleaseResult struct {
	// Released copies; Left on the hold (0: the hold is gone).
	Released, Left int64
	// Domain is the hold's domain; DomainHeld and TotalHeld the copies held
	// by it and by all domains after the release.
	Domain     string
	DomainHeld int64
	TotalHeld  int64
	Reaped     Reaped
}

// Release gives back copies of the hold's copies to every pool that counts
// them (copies 0: all of them). A hold with no copies left is gone. Errors:
// ErrBadCopies (copies < 0), ErrBadID, ErrUnknownHold, ErrOverRelease.
func Release(s *State, now time.Time, holdID string, copies int64) (ReleaseResult, error) {
	if s == nil {
		return ReleaseResult{}, ErrNilState
	}
	if copies < 0 || copies > MaxCopies {
		return ReleaseResult{}, fmt.Errorf("%w: copies %d not in [0, %d]", ErrBadCopies, copies, MaxCopies)
	}
	if err := checkID(holdID, "hold id", false); err != nil {
		return ReleaseResult{}, err
	}
	s.init()
	t := now.UnixMicro()
	out := ReleaseResult{Reaped: s.reap(t)}
	h, err := s.holdWith(holdID, copies, "release", ErrOverRelease)
	if err != nil {
		return out, err
	}
	if copies == 0 {
		copies = h.copies
	}
	s.take(h, copies, t)
	out.Released, out.Left, out.Domain = copies, h.copies, h.domain
	out.DomainHeld, out.TotalHeld = s.domains[h.domain], s.total
	return out, nil
}

// holdWith returns hold holdID if it has the copies that op (a release or
// a transfer) gives up; over is op's error when it has fewer.
func (s *State) holdWith(holdID string, copies int64, op string, over error) (*hold, error) {
	h := s.holds[holdID]
	if h == nil {
		return nil, fmt.Errorf("%w: %q", ErrUnknownHold, holdID)
	}
	if copies > h.copies {
		return nil, fmt.Errorf("%w: %s of %d copies, hold %q has %d", over, op, copies, holdID, h.copies)
	}
	return h, nil
}

// take removes n copies from h, and h when none are left.
func (s *State) take(h *hold, n, t int64) {
	s.add(h.domain, h.groups, -n)
	h.copies -= n
	if h.copies == 0 {
		s.dropHold(h, t)
	}
}

// TransferResult is the answer to a transfer.
type TransferResult struct {
	// TransferID stages Copies copies until Expires; Left copies remain on
	// the hold (0: the hold is gone).
	TransferID string
	Copies     int64
	Left       int64
	Expires    time.Time
	Reaped     Reaped
}

// Transfer stages copies of the hold's copies (0: all of them) under
// transferID until now+ttl: they still count against every limit, under
// the hold's domain and groups, but only Seize can take them; when the ttl
// lapses they are released. transferID is chosen by the caller (at least
// 128 random bits: whoever knows it can seize). Errors: ErrBadCopies,
// ErrBadLease (ttl), ErrBadID, ErrUnknownHold, ErrOverTransfer,
// ErrTransferExists.
func Transfer(s *State, now time.Time, holdID string, copies int64, ttl time.Duration, transferID string) (TransferResult, error) {
	if s == nil {
		return TransferResult{}, ErrNilState
	}
	if copies < 0 || copies > MaxCopies {
		return TransferResult{}, fmt.Errorf("%w: copies %d not in [0, %d]", ErrBadCopies, copies, MaxCopies)
	}
	if err := checkArgs(ttl, "ttl", idArg{holdID, "hold id", false}, idArg{transferID, "transfer id", false}); err != nil {
		return TransferResult{}, err
	}
	s.init()
	t := now.UnixMicro()
	out := TransferResult{Reaped: s.reap(t)}
	h, err := s.holdWith(holdID, copies, "transfer", ErrOverTransfer)
	if err != nil {
		return out, err
	}
	if _, dup := s.transfers[transferID]; dup {
		return out, fmt.Errorf("%w: %q", ErrTransferExists, transferID)
	}
	if copies == 0 {
		copies = h.copies
	}
	x := &transfer{id: transferID, domain: h.domain, copies: copies, groups: h.groups, expires: t + ttl.Microseconds()}
	s.transfers[transferID] = x
	s.lower(x.expires)
	h.copies -= copies // the counts keep the staged copies
	if h.copies == 0 {
		s.dropHold(h, t)
	}
	out.TransferID, out.Copies, out.Left, out.Expires = transferID, copies, h.copies, time.UnixMicro(x.expires)
	return out, nil
}

// SeizeResult is the answer to a seize: a hold indistinguishable from a
// reserved one.
type SeizeResult struct {
	HoldID  string
	Copies  int64
	Token   int64
	Expires time.Time
	// Domain and Groups are the transferred hold's, unchanged by the
	// transfer.
	Domain string
	Groups []string
	Reaped Reaped
}

// Seize turns the staged transfer into a new hold holdID of session with
// the given lease, and issues it a fencing token. Errors: ErrBadLease,
// ErrBadID, ErrUnknownTransfer (unknown, lapsed or already seized),
// ErrHoldExists.
func Seize(s *State, now time.Time, transferID, holdID, session string, lease time.Duration) (SeizeResult, error) {
	if s == nil {
		return SeizeResult{}, ErrNilState
	}
	if err := checkArgs(lease, "lease", idArg{transferID, "transfer id", false}, idArg{holdID, "hold id", false},
		idArg{session, "session", true}); err != nil {
		return SeizeResult{}, err
	}
	s.init()
	t := now.UnixMicro()
	out := SeizeResult{Reaped: s.reap(t)}
	x := s.transfers[transferID]
	if x == nil {
		return out, fmt.Errorf("%w: %q", ErrUnknownTransfer, transferID)
	}
	if _, dup := s.holds[holdID]; dup {
		return out, fmt.Errorf("%w: %q", ErrHoldExists, holdID)
	}
	delete(s.transfers, transferID)
	s.token++
	h := &hold{id: holdID, domain: x.domain, session: session, copies: x.copies, groups: x.groups,
		token: s.token, expires: t + lease.Microseconds()}
	s.putHold(h)
	out.HoldID, out.Copies, out.Token, out.Expires = h.id, h.copies, h.token, time.UnixMicro(h.expires)
	out.Domain, out.Groups = h.domain, clone(h.groups)
	return out, nil
}

// KeepAliveResult is the answer to a keep-alive.
type KeepAliveResult struct {
	// Holds is the number of holds kept alive; Expires the earliest of
	// their expiries after the keep-alive (zero when Holds is 0).
	Holds   int
	Expires time.Time
	Reaped  Reaped
}

// KeepAlive extends to now+lease the lease of hold holdID when holdID is
// not empty, else of every hold of session; a lease is never shortened. A
// session with no holds is not an error (Holds 0). Errors: ErrBadLease,
// ErrBadID (both empty, or too long), ErrUnknownHold (holdID given).
func KeepAlive(s *State, now time.Time, session, holdID string, lease time.Duration) (KeepAliveResult, error) {
	if s == nil {
		return KeepAliveResult{}, ErrNilState
	}
	if err := checkArgs(lease, "lease", idArg{session, "session", true}, idArg{holdID, "hold id", true}); err != nil {
		return KeepAliveResult{}, err
	}
	if session == "" && holdID == "" {
		return KeepAliveResult{}, fmt.Errorf("%w: neither a session nor a hold id", ErrBadID)
	}
	s.init()
	t := now.UnixMicro()
	exp := t + lease.Microseconds()
	out := KeepAliveResult{Reaped: s.reap(t)}
	first := never
	extend := func(h *hold) {
		if exp > h.expires {
			h.expires = exp
		}
		first = min(first, h.expires)
		out.Holds++
	}
	if holdID != "" {
		h := s.holds[holdID]
		if h == nil {
			return out, fmt.Errorf("%w: %q", ErrUnknownHold, holdID)
		}
		extend(h)
	} else {
		for id := range s.sessions[session] {
			extend(s.holds[id])
		}
	}
	if out.Holds > 0 {
		out.Expires = time.UnixMicro(first)
	}
	return out, nil
}

// SessionResult is the answer to ReleaseSession.
type SessionResult struct {
	// Holds and Copies released.
	Holds  int
	Copies int64
	Reaped Reaped
}

// ReleaseSession releases every hold of session, as when its stream ends.
// Transfers staged from them stay staged. Errors: ErrBadID.
func ReleaseSession(s *State, now time.Time, session string) (SessionResult, error) {
	if s == nil {
		return SessionResult{}, ErrNilState
	}
	if err := checkID(session, "session", false); err != nil {
		return SessionResult{}, err
	}
	s.init()
	t := now.UnixMicro()
	out := SessionResult{Reaped: s.reap(t)}
	for id := range s.sessions[session] {
		h := s.holds[id]
		out.Holds++
		out.Copies += h.copies
		s.take(h, h.copies, t)
	}
	return out, nil
}

// Expire releases, at now, every hold whose lease lapsed (expiry <= now),
// every staged transfer whose ttl lapsed, and drops reservation records
// past their expiry whose hold is gone. Every other operation does this
// first.
func Expire(s *State, now time.Time) (Reaped, error) {
	if s == nil {
		return Reaped{}, ErrNilState
	}
	s.init()
	return s.reap(now.UnixMicro()), nil
}

// idArg is an id argument of an operation: its value, its name in errors,
// and whether it may be empty.
type idArg struct {
	v, name string
	emptyOK bool
}

// checkArgs checks an operation's lease (or ttl), then its ids in order,
// and returns the first error.
func checkArgs(lease time.Duration, leaseName string, ids ...idArg) error {
	if err := checkLease(lease, leaseName); err != nil {
		return err
	}
	for _, a := range ids {
		if err := checkID(a.v, a.name, a.emptyOK); err != nil {
			return err
		}
	}
	return nil
}

func checkLease(d time.Duration, name string) error {
	if d < time.Microsecond || d > MaxLease {
		return fmt.Errorf("%w: %s %v not in [1µs, %v]", ErrBadLease, name, d, MaxLease)
	}
	return nil
}

func checkID(v, name string, emptyOK bool) error {
	if v == "" && !emptyOK {
		return fmt.Errorf("%w: empty %s", ErrBadID, name)
	}
	if len(v) > MaxIDLen {
		return fmt.Errorf("%w: %s longer than %d bytes", ErrBadID, name, MaxIDLen)
	}
	return nil
}
