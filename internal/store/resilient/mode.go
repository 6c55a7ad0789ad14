package resilient

import (
	"errors"
	"fmt"
	"strings"
)

// Mode is what Decide does when the remote store fails or the circuit
// breaker is open. The zero value is ModeLocal. Mode implements flag.Value
// (the --failure-mode flag).
type Mode uint8

// Failure modes.
const (
	// ModeLocal decides from a process-local in-memory store.
	ModeLocal Mode = iota
	// ModeOpen grants every item in full.
	ModeOpen
	// ModeClosed rejects every item but refunds.
	ModeClosed
	// ModeUnavailable returns an error wrapping ErrUnavailable.
	ModeUnavailable
)

// Errors of the package.
var (
	// ErrUnavailable is wrapped by the error Decide returns in
	// ModeUnavailable when the remote failed or the breaker is open.
	ErrUnavailable = errors.New("resilient: store unavailable")
	// ErrBreakerOpen is wrapped, with ErrUnavailable, when the call was not
	// tried because the circuit breaker is open.
	ErrBreakerOpen = errors.New("resilient: circuit breaker open")
	// ErrBadMode is wrapped by ParseMode's error.
	ErrBadMode = errors.New("resilient: bad failure mode")
)

var modeNames = [...]string{ModeLocal: "local", ModeOpen: "open", ModeClosed: "closed", ModeUnavailable: "unavailable"}

// ParseMode parses a --failure-mode value: local, open, closed or
// unavailable (case-insensitive, surrounding spaces ignored).
func ParseMode(s string) (Mode, error) {
	v := strings.ToLower(strings.TrimSpace(s))
	for m, name := range modeNames {
		if v == name {
			return Mode(m), nil
		}
	}
	return 0, fmt.Errorf("%w: --failure-mode %q: want local, open, closed or unavailable", ErrBadMode, s)
}

// String returns the flag value naming m.
func (m Mode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("Mode(%d)", m)
}

// Set parses s into m, for flag.Var.
func (m *Mode) Set(s string) error {
	v, err := ParseMode(s)
	if err != nil {
		return err
	}
	*m = v
	return nil
}
