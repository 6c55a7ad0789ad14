// Package copylog implements Charon's copy-limited resources (SPEC §4, paper
// §2.2, §3.1, §4.2 "Copy Log") as pure functions over values: a distributed
// counting semaphore with domain, global and group pools, holds with
// leases, staged transfers, fencing tokens and idempotent reserves. It does
// no I/O, starts no goroutines and never reads the clock: the caller passes
// now, and the ids of new holds and transfers.
//
// A store keeps one State per copy-limited resource, serializes the
// operations on it, and passes the resource's Config to Reserve (the only
// operation that reads the limits).
//
// # Time and numbers
//
// Inside the package time is an int64 count of microseconds since the Unix
// epoch (now.UnixMicro()); leases and ttls are truncated to whole
// microseconds and lie in [1 µs, MaxLease]. Limits and copies lie in [0,
// MaxCopies] = [0, 2^50], so every sum stays below 2^53 and a Lua 5.1
// script, whose numbers are doubles, can mirror every operation exactly.
// The description below is the contract such a script follows; "t" is now
// in µs. Ids (hold, transfer, request, session) and domains are byte
// strings of at most MaxIDLen bytes; hold, transfer and (for
// ReleaseSession) session ids are non-empty.
//
// # State
//
// The copy log of one resource:
//
//   - holds: id -> {domain, copies >= 1, groups (the names of the groups
//     the domain belonged to at reserve time, in config order), session
//     ("" for none), request id ("" for none), token, expires};
//   - transfers: id -> {domain, copies >= 1, groups, expires}, copies staged
//     by Transfer and not yet seized;
//   - records: request id -> {hold id, domain, granted, token, groups,
//     expires}, the answer a retried reserve gets;
//   - sessions: session -> set of hold ids (an index of holds);
//   - held[d] per domain, held[g] per group name and total: the copies of
//     the holds and transfers of domain d, of those whose groups include g,
//     and of all (zero entries are deleted);
//   - token: the last fencing token issued (0 at first);
//   - next: a lower bound of every expires in the state (or +inf), an
//     optimization a script may keep or not: reaping at t < next does
//     nothing.
//
// The counts are always the sums over holds and transfers (tests check
// it). A hold or a transfer with expires <= t has lapsed at t: a lease of d
// granted at t lives in [t, t+d).
//
// # Operations
//
// Each operation first validates its arguments (an invalid one is an
// error that changes nothing), then reaps at t, then decides; a rejection
// or an error found after reaping changes nothing more.
//
// Reap(t): every hold with expires <= t is removed and its copies are
// subtracted from held[domain], held[g] for each of its groups, and total;
// likewise every transfer with expires <= t; every record with expires <= t
// whose hold no longer exists is removed; next becomes the least expires
// left (records of live holds count only while unexpired). Expire is Reap
// alone and returns what it released.
//
// Reserve(cfg, d, copies k in [1, MaxCopies], min m in [0, k] (0 means 1),
// hold id, request id q, session, lease): when q is not empty and records
// has q: with another domain it is ErrRequestIDReused; otherwise the answer
// is the record's (Replayed), the record's expires is raised to t+lease,
// and when its hold still exists the hold is moved to this session and its
// expires raised to t+lease; when it does not, the answer is not OK, grants
// 0 and says so (HoldGone). Otherwise a
// hold id already in holds is ErrHoldExists. The domain limit D is
// cfg.Overrides[d] if present, else cfg.DomainLimit; G is cfg.GlobalLimit
// (0: none); the groups of d are those of cfg.Groups, in order, whose
// Members contain d. n = min(k, D - held[d], G - total if G > 0, and
// L_g - held[g] for each group g of d), not below 0. When n < m the reserve
// is rejected (n = 0). Otherwise token += 1 and a hold {d, n, groups, ...,
// token, expires t+lease} is added, n is added to held[d], held[g] of each
// of its groups and total, and, when q is not empty, records[q] = {hold
// id, d, n, token, groups, t+lease}. LimitedBy* name the limit that gave
// the least n (the first such of domain, global, groups in order) when it
// was below k. The context reports D, G, held[d], total and each group of d
// with its limit and held[g], after the decision.
//
// Release(hold id, copies c >= 0; 0 means all): an unknown hold is
// ErrUnknownHold, c above its copies ErrOverRelease. Otherwise c is
// subtracted from the hold and from held[domain], held[g] of each of the
// hold's groups (those captured at reserve time, whatever the config now
// says), and total; a hold left with 0 copies is removed.
//
// Transfer(hold id, copies c >= 0 (0: all), ttl, transfer id x): errors as
// Release (ErrOverTransfer), and ErrTransferExists when x is in transfers.
// Otherwise c is taken from the hold (removed at 0) and transfers[x] =
// {domain, c, groups, t+ttl} is added; the counts do not change.
//
// Seize(transfer id x, hold id, session, lease): x not in transfers is
// ErrUnknownTransfer, a hold id in use ErrHoldExists. Otherwise x is
// removed, token += 1, and a hold {x's domain, copies and groups, session,
// token, t+lease} is added; the counts do not change.
//
// KeepAlive(session, hold id, lease): with a hold id, that hold (else
// ErrUnknownHold), else every hold of the session, get expires =
// max(expires, t+lease); the answer is the least of those expiries.
// Transfers are not kept alive.
//
// ReleaseSession(session): every hold of the session is released as by
// Release of all its copies. Its staged transfers stay.
//
// Records are removed with their hold when they have expired by then, and
// by Reap otherwise, so they are bounded by the holds plus the reserves of
// the last lease.
//
// # Ids and tokens
//
// Hold and transfer ids come from the caller: a store passes at least 128
// random bits, so that neither can be guessed (whoever knows a transfer id
// can seize it, and holds must not be released by strangers) and an id
// never repeats even when a State is dropped and made again. The fencing
// token increases by one with every grant (a reserve that creates a hold,
// a seize) and never otherwise; a State that is Empty may be dropped by a
// store that keeps its Token and Seeds the next one with it.
//
// Limits lowered by a config reload below what is held are not enforced on
// existing holds: no reserve is granted until enough copies are released.
package copylog
