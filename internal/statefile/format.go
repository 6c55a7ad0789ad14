package statefile

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"

	"github.com/charonlimit/charon/tiers"
)

// Magic opens every state file.
const Magic = "CHARONST"

// Version is the format this package writes and reads. Version 2 keys a
// pair's state by its policy's shape (tiers.Policy.Shape), not a hash of
// the policy with its limits, a resource's global state by the resource
// alone, and keeps what a token bucket owes with its unit; a file of
// version 1 is ErrEarlier.
const Version = 2

// Errors of Decode, wrapped with the details.
var (
	// ErrForeign is a file that is not a Charon state file.
	ErrForeign = errors.New("statefile: not a charon state file")
	// ErrVersion is a state file of a format version this build does not
	// read.
	ErrVersion = errors.New("statefile: unsupported version")
	// ErrEarlier is a state file of an earlier format version, which an
	// upgrade meets once: its states were keyed in a way this build does
	// not read (a Keeper starts empty).
	ErrEarlier = errors.New("statefile: written by an earlier version")
	// ErrCorrupt is a state file that is truncated or damaged: its checksum
	// or its records do not hold.
	ErrCorrupt = errors.New("statefile: corrupt")
)

// Never is the Forget of a state that is never forgotten.
const Never = math.MaxInt64

// Record is one state of the in-memory store.
type Record struct {
	// Resource, Domain and PolicyID are the state's store.Key (PolicyID
	// the policy's shape); a global state's Domain and PolicyID are empty.
	Resource string
	Domain   string
	PolicyID uint64
	// Forget is when the state may be forgotten (tiers.ForgetAt), in Unix
	// µs; Never for a state kept for ever.
	Forget int64
	// State is the compact form: a pair's (tiers.State.AppendCompact, its
	// first integer the policy's Kind) or a global's
	// (tiers.Global.AppendCompact, first integer tiers.GlobalCompact).
	State []int64
}

// Global reports whether r is a resource's global state.
func (r *Record) Global() bool { return len(r.State) > 0 && r.State[0] == tiers.GlobalCompact }

// Kind is the kind of the policy r's pair state was kept under (meaningless
// for a global state).
func (r *Record) Kind() tiers.Kind { return tiers.Kind(r.State[0]) }

// headerLen is the magic, the version (uint32), the record count (uint32)
// and the instant written (int64, Unix µs); a CRC-32C of everything before
// it ends the file.
const (
	headerLen  = len(Magic) + 4 + 4 + 8
	trailerLen = 4
	// Bounds that keep a damaged length from allocating wildly; real
	// values are far below them (keys are at most 256 bytes, a compact
	// state a few hundred integers).
	maxString = 1 << 16
	maxInts   = 1 << 16
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Append appends the encoding of recs, written at writtenUS (Unix µs), to
// dst.
func Append(dst []byte, writtenUS int64, recs []Record) []byte {
	start := len(dst)
	dst = append(dst, Magic...)
	dst = binary.LittleEndian.AppendUint32(dst, Version)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(recs)))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(writtenUS))
	for i := range recs {
		r := &recs[i]
		dst = binary.LittleEndian.AppendUint64(dst, r.PolicyID)
		dst = binary.LittleEndian.AppendUint64(dst, uint64(r.Forget))
		dst = binary.AppendUvarint(dst, uint64(len(r.Resource)))
		dst = append(dst, r.Resource...)
		dst = binary.AppendUvarint(dst, uint64(len(r.Domain)))
		dst = append(dst, r.Domain...)
		dst = binary.AppendUvarint(dst, uint64(len(r.State)))
		for _, v := range r.State {
			dst = binary.AppendVarint(dst, v)
		}
	}
	return binary.LittleEndian.AppendUint32(dst, crc32.Checksum(dst[start:], castagnoli))
}

// Decode returns the records of a state file's contents and the instant it
// was written (Unix µs). It checks, in order, the magic (ErrForeign), the
// version (ErrEarlier, ErrVersion), the checksum and then every record (ErrCorrupt): a
// record's state must be a compact form that tiers reads back.
func Decode(b []byte) (recs []Record, writtenUS int64, err error) {
	if len(b) < len(Magic) || string(b[:len(Magic)]) != Magic {
		return nil, 0, ErrForeign
	}
	if len(b) < headerLen+trailerLen {
		return nil, 0, fmt.Errorf("%w: truncated header (%d bytes)", ErrCorrupt, len(b))
	}
	switch v := binary.LittleEndian.Uint32(b[len(Magic):]); {
	case v >= 1 && v < Version:
		return nil, 0, fmt.Errorf("%w: version %d (this build reads version %d)", ErrEarlier, v, Version)
	case v != Version:
		return nil, 0, fmt.Errorf("%w %d (this build reads version %d)", ErrVersion, v, Version)
	}
	body := b[:len(b)-trailerLen]
	if got, want := crc32.Checksum(body, castagnoli), binary.LittleEndian.Uint32(b[len(body):]); got != want {
		return nil, 0, fmt.Errorf("%w: checksum %08x, want %08x (truncated or damaged)", ErrCorrupt, got, want)
	}
	n := binary.LittleEndian.Uint32(b[len(Magic)+4:])
	writtenUS = int64(binary.LittleEndian.Uint64(b[len(Magic)+8:]))
	d := decoder{b: body, i: headerLen}
	// Each record takes at least 19 bytes: do not trust n for the
	// allocation.
	recs = make([]Record, 0, min(int(n), (len(body)-headerLen)/19))
	var st tiers.State
	var g tiers.Global
	for k := range n {
		r := Record{PolicyID: d.u64(), Forget: int64(d.u64()), Resource: d.str(), Domain: d.str()}
		m := d.uvarint()
		if m > maxInts || m > uint64(len(body)-d.i) {
			d.bad = true
		}
		if !d.bad {
			r.State = make([]int64, m)
			for j := range r.State {
				r.State[j] = d.varint()
			}
		}
		if d.bad {
			return nil, 0, fmt.Errorf("%w: record %d of %d is cut short", ErrCorrupt, k+1, n)
		}
		if err := check(&r, &st, &g); err != nil {
			return nil, 0, fmt.Errorf("%w: record %d of %d (%s %q): %v", ErrCorrupt, k+1, n, r.Resource, r.Domain, err)
		}
		recs = append(recs, r)
	}
	if d.i != len(body) {
		return nil, 0, fmt.Errorf("%w: %d bytes after the last of %d records", ErrCorrupt, len(body)-d.i, n)
	}
	return recs, writtenUS, nil
}

// check reports whether r's state is a compact form tiers reads back, using
// st and g as scratch.
func check(r *Record, st *tiers.State, g *tiers.Global) error {
	if len(r.State) == 0 {
		return errors.New("empty state")
	}
	if r.Global() {
		if r.Domain != "" {
			return errors.New("a global state with a domain")
		}
		return g.SetCompact(r.State)
	}
	switch k := r.Kind(); k {
	case tiers.KindTiers, tiers.KindTokenBucket, tiers.KindFixedWindow, tiers.KindQuota:
		if int64(k) != r.State[0] {
			break
		}
		return st.SetCompact(&tiers.Policy{Kind: k}, r.State)
	}
	return fmt.Errorf("unknown state kind %d", r.State[0])
}

// decoder reads a record's fields; bad is set when the data runs out.
type decoder struct {
	b   []byte
	i   int
	bad bool
}

func (d *decoder) u64() uint64 {
	if d.bad || len(d.b)-d.i < 8 {
		d.bad = true
		return 0
	}
	d.i += 8
	return binary.LittleEndian.Uint64(d.b[d.i-8:])
}

func (d *decoder) uvarint() uint64 { return decodeVarint(d, binary.Uvarint) }

func (d *decoder) varint() int64 { return decodeVarint(d, binary.Varint) }

// decodeVarint reads one varint with read (binary.Uvarint or binary.Varint),
// marking d bad when the input ends or overflows.
func decodeVarint[T uint64 | int64](d *decoder, read func([]byte) (T, int)) T {
	if d.bad {
		return 0
	}
	v, n := read(d.b[d.i:])
	if n <= 0 {
		d.bad = true
		return 0
	}
	d.i += n
	return v
}

func (d *decoder) str() string {
	n := d.uvarint()
	if d.bad || n > maxString || n > uint64(len(d.b)-d.i) {
		d.bad = true
		return ""
	}
	d.i += int(n)
	return string(d.b[d.i-int(n) : d.i])
}
