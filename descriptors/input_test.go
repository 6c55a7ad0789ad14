package descriptors

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestValidateResource(t *testing.T) {
	long := strings.Repeat("x", MaxLen+1)
	max := strings.Repeat("x", MaxLen)
	ok := []Entry{{Key: "k", Value: "v"}}
	many := make([]Entry, MaxEntries+1)
	for i := range many {
		many[i] = Entry{Key: "k"}
	}
	full := make([]Entry, MaxEntries)
	for i := range full {
		full[i] = Entry{Key: max, Value: max}
	}
	for _, tc := range []struct {
		name    string
		domain  string
		entries []Entry
		want    string // the error's text; "" for none
	}{
		{"valid", "rl", ok, ""},
		{"at the bounds", max, full, ""},
		{"empty value", "rl", []Entry{{Key: "k"}}, ""},
		{"empty domain", "", ok, "resource.domain: empty"},
		{"long domain", long, ok, fmt.Sprintf("resource.domain: %d bytes, longer than %d", MaxLen+1, MaxLen)},
		{"no entries", "rl", nil, "resource.entries: empty"},
		{"too many entries", "rl", many, fmt.Sprintf("resource.entries: %d entries, more than %d", MaxEntries+1, MaxEntries)},
		{"empty key", "rl", []Entry{{Key: "k"}, {Value: "v"}}, "resource.entries[1].key: empty"},
		{"long key", "rl", []Entry{{Key: long}}, fmt.Sprintf("resource.entries[0].key: %d bytes, longer than %d", MaxLen+1, MaxLen)},
		{"long value", "rl", []Entry{{Key: "k", Value: long}}, fmt.Sprintf("resource.entries[0].value: %d bytes, longer than %d", MaxLen+1, MaxLen)},
	} {
		err := ValidateResource(tc.domain, tc.entries)
		if tc.want == "" {
			if err != nil {
				t.Errorf("%s: got %v, want nil", tc.name, err)
			}
			continue
		}
		var in *InputError
		if !errors.As(err, &in) {
			t.Errorf("%s: got %v, want an *InputError", tc.name, err)
			continue
		}
		if got := err.Error(); got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestFieldErrorUnwraps: a *FieldError names its field and lets errors.Is
// and errors.As reach its cause, however deeply it is wrapped.
func TestFieldErrorUnwraps(t *testing.T) {
	err := fmt.Errorf("reserve: %w", &FieldError{Field: "resource", Err: fmt.Errorf("%w: no limit matches domain %q and its entries", ErrUnknownResource, "rl")})
	if !errors.Is(err, ErrUnknownResource) {
		t.Errorf("errors.Is(%v, ErrUnknownResource) = false, want true", err)
	}
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "resource" {
		t.Errorf("errors.As(%v) = %+v, want a *FieldError of field resource", err, fe)
	}
	if want := `reserve: resource: engine: unknown resource: no limit matches domain "rl" and its entries`; err.Error() != want {
		t.Errorf("got %q, want %q", err.Error(), want)
	}
	var in *InputError
	if errors.As(err, &in) {
		t.Errorf("errors.As(%v) found an *InputError %+v, want none", err, in)
	}
}
