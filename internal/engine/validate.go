package engine

import "fmt"

// validate reports the first field of req that cannot be decided.
func (e *Engine) validate(req *Request) error {
	switch {
	case req == nil:
		return &InputError{Field: "request", Message: "missing"}
	case req.Domain == "":
		return &InputError{Field: "domain", Message: "empty"}
	case len(req.Domain) > MaxLen:
		return &InputError{Field: "domain", Message: fmt.Sprintf("%d bytes, longer than %d", len(req.Domain), MaxLen)}
	case len(req.Descriptors) == 0:
		return &InputError{Field: "descriptors", Message: "empty"}
	case len(req.Descriptors) > e.maxDesc:
		return &InputError{Field: "descriptors", Message: fmt.Sprintf("%d descriptors, more than %d", len(req.Descriptors), e.maxDesc)}
	case uint64(req.Hits) > e.maxHits:
		return &InputError{Field: "hits_addend", Message: fmt.Sprintf("%d, more than %d", req.Hits, e.maxHits)}
	}
	for i := range req.Descriptors {
		d := &req.Descriptors[i]
		switch {
		case len(d.Entries) == 0:
			return &InputError{Field: fmt.Sprintf("descriptors[%d].entries", i), Message: "empty"}
		case len(d.Entries) > MaxEntries:
			return &InputError{Field: fmt.Sprintf("descriptors[%d].entries", i), Message: fmt.Sprintf("%d entries, more than %d", len(d.Entries), MaxEntries)}
		case d.HasHits && d.Hits > e.maxHits:
			return &InputError{Field: fmt.Sprintf("descriptors[%d].hits_addend", i), Message: fmt.Sprintf("%d, more than %d", d.Hits, e.maxHits)}
		}
		for j := range d.Entries {
			en := &d.Entries[j]
			switch {
			case en.Key == "":
				return &InputError{Field: fmt.Sprintf("descriptors[%d].entries[%d].key", i, j), Message: "empty"}
			case len(en.Key) > MaxLen:
				return &InputError{Field: fmt.Sprintf("descriptors[%d].entries[%d].key", i, j), Message: fmt.Sprintf("%d bytes, longer than %d", len(en.Key), MaxLen)}
			case len(en.Value) > MaxLen:
				return &InputError{Field: fmt.Sprintf("descriptors[%d].entries[%d].value", i, j), Message: fmt.Sprintf("%d bytes, longer than %d", len(en.Value), MaxLen)}
			}
		}
		if o := d.Override; o != nil && o.Unit.Length() == 0 {
			return &InputError{Field: fmt.Sprintf("descriptors[%d].limit.unit", i), Message: fmt.Sprintf("unknown unit %d", o.Unit)}
		}
	}
	return nil
}
