package engine

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"

	"github.com/charonlimit/charon/descriptors"
)

// validate reports the first field of req that cannot be decided. It also
// bounds what a client controls and Envoy passes on, rather than fail the
// request (an error is a grant behind Envoy's usual failure_mode_deny:
// false): a value longer than descriptors.MaxLen becomes BoundValue's
// stand-in, and a descriptor's hits_addend above the most hits is that most.
func (e *Engine) validate(req *Request) error {
	switch {
	case req == nil:
		return &descriptors.InputError{Field: "request", Message: "missing"}
	case req.Domain == "":
		return &descriptors.InputError{Field: "domain", Message: "empty"}
	case len(req.Domain) > descriptors.MaxLen:
		return &descriptors.InputError{Field: "domain", Message: fmt.Sprintf("%d bytes, longer than %d", len(req.Domain), descriptors.MaxLen)}
	case len(req.Descriptors) == 0:
		return &descriptors.InputError{Field: "descriptors", Message: "empty"}
	case len(req.Descriptors) > e.maxDesc:
		return &descriptors.InputError{Field: "descriptors", Message: fmt.Sprintf("%d descriptors, more than %d", len(req.Descriptors), e.maxDesc)}
	case uint64(req.Hits) > e.maxHits:
		return &descriptors.InputError{Field: "hits_addend", Message: fmt.Sprintf("%d, more than %d", req.Hits, e.maxHits)}
	}
	for i := range req.Descriptors {
		d := &req.Descriptors[i]
		if n := len(d.Entries); d.Refund && n > 0 && d.Entries[n-1].Key == SlotKey {
			// The take a stream-done refund gives back (SlotKey): read
			// off before the descriptor is matched.
			us, err := strconv.ParseInt(d.Entries[n-1].Value, 10, 64)
			if err != nil || us <= 0 {
				return &descriptors.InputError{Field: fmt.Sprintf("descriptors[%d].entries[%d].value", i, n-1),
					Message: fmt.Sprintf("%s must be a take's instant in microseconds since the Unix epoch, not %q", SlotKey, descriptors.Truncate(d.Entries[n-1].Value))}
			}
			d.Entries, d.SlotsAt = d.Entries[:n-1], time.UnixMicro(us)
		}
		switch {
		case len(d.Entries) == 0:
			return &descriptors.InputError{Field: fmt.Sprintf("descriptors[%d].entries", i), Message: "empty"}
		case len(d.Entries) > descriptors.MaxEntries:
			return &descriptors.InputError{Field: fmt.Sprintf("descriptors[%d].entries", i), Message: fmt.Sprintf("%d entries, more than %d", len(d.Entries), descriptors.MaxEntries)}
		}
		if d.HasHits && d.Hits > e.maxHits {
			d.Hits = e.maxHits
		}
		for j := range d.Entries {
			en := &d.Entries[j]
			switch {
			case en.Key == "":
				return &descriptors.InputError{Field: fmt.Sprintf("descriptors[%d].entries[%d].key", i, j), Message: "empty"}
			case len(en.Key) > descriptors.MaxLen:
				return &descriptors.InputError{Field: fmt.Sprintf("descriptors[%d].entries[%d].key", i, j), Message: fmt.Sprintf("%d bytes, longer than %d", len(en.Key), descriptors.MaxLen)}
			}
			en.Value = BoundValue(en.Value)
		}
		if o := d.Override; o != nil && o.Unit.Length() == 0 {
			return &descriptors.InputError{Field: fmt.Sprintf("descriptors[%d].limit.unit", i), Message: fmt.Sprintf("unknown unit %d", o.Unit)}
		}
	}
	return nil
}

// BoundValue returns v when it is at most descriptors.MaxLen bytes long,
// else a stand-in of MaxLen bytes: v's first MaxLen-33 bytes, "#" and 32
// hex digits of its SHA-256. The stand-in keeps v's prefix (a wildcard value
// such as "files/*" still matches it), and distinct long values keep
// distinct counters in every process (the hash is of the whole value).
func BoundValue(v string) string {
	if len(v) <= descriptors.MaxLen {
		return v
	}
	sum := sha256.Sum256([]byte(v))
	keep := descriptors.MaxLen - 1 - 2*16
	return v[:keep] + "#" + hex.EncodeToString(sum[:16])
}
