package descriptors

import (
	"errors"
	"fmt"
)

// Bounds of a request's descriptors, the same for an RLS request and a
// charon.v1 resource. MaxKeyLen bounds the identities built from them.
const (
	// MaxEntries bounds the entries of one descriptor.
	MaxEntries = 16
	// MaxLen bounds, in bytes, the domain and every key and value.
	MaxLen = 1024
)

// ErrUnknownResource is wrapped (in a *FieldError of field "resource") by
// the error of an operation whose descriptor matches no configured limit
// in an RLS domain that does not allow unconfigured resources. Its text
// keeps the "engine:" prefix it had before it moved here: clients read it
// in NOT_FOUND messages.
var ErrUnknownResource = errors.New("engine: unknown resource")

// InputError is a request that cannot be decided; Field names the culprit,
// e.g. "descriptors[2].entries[0].key". Bad input is always one: the
// server answers it INVALID_ARGUMENT.
type InputError struct {
	Field, Message string
}

func (e *InputError) Error() string { return e.Field + ": " + e.Message }

// FieldError is an operation's error attributed to a request field, e.g.
// "hold_id" or "copies"; Err is the cause (errors.Is sees through).
type FieldError struct {
	Field string
	Err   error
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Err.Error() }
func (e *FieldError) Unwrap() error { return e.Err }

// ValidateResource reports, as an *InputError, the first field of a
// charon.v1 resource (an RLS domain and one descriptor's entries) that
// cannot be matched, or nil: the rate operation (internal/engine's Request)
// and the copy operations (internal/holds) check their resource with it.
func ValidateResource(domain string, entries []Entry) error {
	switch {
	case domain == "":
		return &InputError{Field: "resource.domain", Message: "empty"}
	case len(domain) > MaxLen:
		return &InputError{Field: "resource.domain", Message: fmt.Sprintf("%d bytes, longer than %d", len(domain), MaxLen)}
	case len(entries) == 0:
		return &InputError{Field: "resource.entries", Message: "empty"}
	case len(entries) > MaxEntries:
		return &InputError{Field: "resource.entries", Message: fmt.Sprintf("%d entries, more than %d", len(entries), MaxEntries)}
	}
	for j := range entries {
		en := &entries[j]
		switch {
		case en.Key == "":
			return &InputError{Field: fmt.Sprintf("resource.entries[%d].key", j), Message: "empty"}
		case len(en.Key) > MaxLen:
			return &InputError{Field: fmt.Sprintf("resource.entries[%d].key", j), Message: fmt.Sprintf("%d bytes, longer than %d", len(en.Key), MaxLen)}
		case len(en.Value) > MaxLen:
			return &InputError{Field: fmt.Sprintf("resource.entries[%d].value", j), Message: fmt.Sprintf("%d bytes, longer than %d", len(en.Value), MaxLen)}
		}
	}
	return nil
}
