package descriptors

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxQuoted bounds, in bytes, a request value (or an error quoting one) in
// an error message or a log line; see Truncate.
const MaxQuoted = 128

// Truncate returns s cut to at most MaxQuoted bytes, at a rune boundary,
// followed by "…" when it was cut: request values reach errors and logs
// through it.
func Truncate(s string) string {
	if len(s) <= MaxQuoted {
		return s
	}
	i := MaxQuoted
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "…"
}

// ParseDescriptor parses a descriptor written "k=v,k2=v2" (a value may hold
// "=", not ","), as the explain endpoint and the command line take it.
func ParseDescriptor(s string) ([]Entry, error) {
	var es []Entry
	for _, part := range strings.Split(s, ",") {
		k, v, _ := strings.Cut(part, "=")
		if k == "" {
			return nil, fmt.Errorf("descriptor entry %q has no key (want k=v,k2=v2)", Truncate(part))
		}
		es = append(es, Entry{Key: k, Value: v})
	}
	return es, nil
}
