package copylog

import "errors"

// Errors of the package. Operations wrap them with the offending value
// (fmt's %w); compare with errors.Is. A server maps each to its own gRPC code.
var (
	// ErrNilState: the operation was given a nil *State.
	ErrNilState = errors.New("copylog: nil state")
	// ErrBadConfig: nil config, a negative or too large limit, or a group
	// with an empty or repeated name.
	ErrBadConfig = errors.New("copylog: invalid config")
	// ErrBadCopies: copies (reserve, release, transfer) out of range.
	ErrBadCopies = errors.New("copylog: copies out of range")
	// ErrBadMin: min copies above copies or negative.
	ErrBadMin = errors.New("copylog: min copies out of range")
	// ErrBadLease: a lease or a transfer's ttl not in (0, MaxLease].
	ErrBadLease = errors.New("copylog: lease out of range")
	// ErrBadID: an empty or too long hold id, transfer id, request id,
	// session or domain.
	ErrBadID = errors.New("copylog: invalid id")
	// ErrHoldExists: Reserve or Seize named a new hold id already in use.
	ErrHoldExists = errors.New("copylog: hold id already in use")
	// ErrTransferExists: Transfer named a transfer id already in use.
	ErrTransferExists = errors.New("copylog: transfer id already in use")
	// ErrUnknownHold: no live hold has the id (never reserved, released,
	// transferred away, or its lease lapsed).
	ErrUnknownHold = errors.New("copylog: unknown hold")
	// ErrUnknownTransfer: no staged transfer has the id (never staged,
	// already seized, or its ttl lapsed; the three are indistinguishable).
	ErrUnknownTransfer = errors.New("copylog: unknown transfer")
	// ErrOverRelease: a release of more copies than the hold has.
	ErrOverRelease = errors.New("copylog: release of more copies than held")
	// ErrOverTransfer: a transfer of more copies than the hold has.
	ErrOverTransfer = errors.New("copylog: transfer of more copies than held")
	// ErrRequestIDReused: a reserve's request id names a reservation made for
	// another domain.
	ErrRequestIDReused = errors.New("copylog: request id reused for another domain")
)
