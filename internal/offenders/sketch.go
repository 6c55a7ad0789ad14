package offenders

import (
	"cmp"
	"hash/maphash"
	"slices"
	"strconv"
	"unsafe"

	"github.com/charonlimit/charon/descriptors"
)

const (
	// KeyCap is the most bytes of a value kept: a longer value is reported
	// as its stand-in, its first KeyCap-17 bytes, "~" and 16 hex digits of
	// its hash (StandIn).
	KeyCap = 64
	// DescCap is the most bytes of the descriptor text ("k=v,k2=v2") kept
	// with a value so that it can be explained; a longer one, or one that
	// cannot be read back (a value holding "," or bytes that are not
	// UTF-8), is not kept.
	DescCap = 128
)

// seed keys the sketches of a process: a client cannot choose values whose
// hashes collide with another's to take over its slot.
var seed = maphash.MakeSeed()

// Hash is the hash sketches key a value by; it differs between processes.
func Hash(value string) uint64 { return maphash.String(seed, value) }

// StandIn returns value when it is at most n bytes long, else its first
// n-17 bytes, "~" and the 16 hex digits of its 64-bit FNV-1a hash (as
// package descriptors shortens an identity): the same in every process, so
// that replicas' answers merge. n must be above 17.
func StandIn(value string, n int) string {
	if len(value) <= n {
		return value
	}
	return string(appendStandIn(make([]byte, 0, n), value, n))
}

func appendStandIn(b []byte, value string, n int) []byte {
	if len(value) <= n {
		return append(b, value...)
	}
	b = append(b, value[:n-17]...)
	b = append(b, '~')
	h := uint64(14695981039346656037)
	for i := 0; i < len(value); i++ {
		h ^= uint64(value[i])
		h *= 1099511628211
	}
	var hex [16]byte
	s := strconv.AppendUint(hex[:0], h, 16)
	for range 16 - len(s) {
		b = append(b, '0')
	}
	return append(b, s...)
}

// slot is one monitored value, its text inline.
type slot struct {
	err        uint64
	klen, dlen uint8
	text       [KeyCap + DescCap]byte
}

func (s *slot) key() string  { return string(s.text[:s.klen]) }
func (s *slot) desc() string { return string(s.text[KeyCap : KeyCap+int(s.dlen)]) }

// Sketch is a Space-Saving sketch of K slots. The zero value is not usable;
// use NewSketch. Not safe for concurrent use.
type Sketch struct {
	// hashes[i] and counts[i] are slot i's hash and count, apart from its
	// text so that the scans for a hash and for the smallest count read
	// contiguous memory.
	hashes, counts []uint64
	slots          []slot
	total          uint64
}

// NewSketch returns an empty sketch of k slots (k at least 1).
func NewSketch(k int) *Sketch {
	k = max(k, 1)
	return &Sketch{hashes: make([]uint64, 0, k), counts: make([]uint64, 0, k), slots: make([]slot, 0, k)}
}

// Bytes is the memory a sketch of k slots holds.
func Bytes(k int) int { return k * (16 + int(unsafe.Sizeof(slot{}))) }

// Reset empties the sketch, keeping its memory.
func (s *Sketch) Reset() {
	s.hashes, s.counts, s.slots, s.total = s.hashes[:0], s.counts[:0], s.slots[:0], 0
}

// Total is the weight added since the last Reset.
func (s *Sketch) Total() uint64 { return s.total }

// Floor is the smallest count of a full sketch, an upper bound of the count
// of any value it does not monitor; 0 when it is not full.
func (s *Sketch) Floor() uint64 {
	if len(s.counts) < cap(s.counts) {
		return 0
	}
	return slices.Min(s.counts)
}

// Add counts w for value (hashed h = Hash(value)); entries, when given, are
// the request descriptor's, kept as its text for the value's first slot.
func (s *Sketch) Add(h uint64, value string, entries []descriptors.Entry, w uint64) {
	s.total += w
	for i, x := range s.hashes {
		if x == h {
			s.counts[i] += w
			return
		}
	}
	var i int
	if len(s.slots) < cap(s.slots) {
		i = len(s.slots)
		s.slots, s.hashes, s.counts = s.slots[:i+1], append(s.hashes, h), append(s.counts, w)
		s.slots[i].err = 0
	} else {
		for j, c := range s.counts {
			if c < s.counts[i] {
				i = j
			}
		}
		s.slots[i].err = s.counts[i]
		s.counts[i] += w
		s.hashes[i] = h
	}
	sl := &s.slots[i]
	sl.klen = uint8(len(appendStandIn(sl.text[:0], value, KeyCap)))
	sl.dlen = uint8(len(appendDesc(sl.text[KeyCap:KeyCap], entries)))
}

// appendDesc writes entries as "k=v,k2=v2" into b (of capacity DescCap), or
// nothing when that text would not fit or could not be read back.
func appendDesc(b []byte, entries []descriptors.Entry) []byte {
	n := 0
	for i, e := range entries {
		n += len(e.Key) + 1 + len(e.Value)
		if i > 0 {
			n++
		}
		if n > DescCap || !readable(e.Key) || !readable(e.Value) {
			return b[:0]
		}
	}
	for i, e := range entries {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, e.Key...)
		b = append(b, '=')
		b = append(b, e.Value...)
	}
	return b
}

// readable reports whether s can be written in a descriptor's text and read
// back by the explain endpoint: printable ASCII without ",".
func readable(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == ',' {
			return false
		}
	}
	return true
}

// Item is a value of a sketch: its true count t is Count-Err <= t <= Count.
type Item struct {
	// Value is the value (Charon domain), or its stand-in when longer than
	// KeyCap bytes.
	Value string `json:"value"`
	// Descriptor is the request descriptor "k=v,k2=v2" first seen with the
	// value, for explain ("" when it was too long or not readable).
	Descriptor string `json:"descriptor,omitempty"`
	Count      uint64 `json:"count"`
	Err        uint64 `json:"error"`
}

// Items returns the monitored values, the highest count first (ties by
// value).
func (s *Sketch) Items() []Item {
	out := make([]Item, len(s.slots))
	for i := range s.slots {
		sl := &s.slots[i]
		out[i] = Item{Value: sl.key(), Descriptor: sl.desc(), Count: s.counts[i], Err: sl.err}
	}
	sortItems(out)
	return out
}

func sortItems(items []Item) {
	slices.SortFunc(items, func(a, b Item) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return cmp.Compare(a.Value, b.Value)
	})
}

// Part is one sketch's view to merge: its items, total and floor.
type Part struct {
	Items []Item `json:"items"`
	Total uint64 `json:"total"`
	Floor uint64 `json:"floor"`
}

// Merge combines sketches of disjoint parts of a stream (epochs, replicas)
// into one ranking, the highest count first, matching values by their text: a value's count sums its
// counts, plus the floor of each part that does not monitor it (it may have
// had up to that many there), and its error grows by the same, so each
// item still brackets the true count. The bound N/K holds over the merged
// stream when every part has K slots.
func Merge(parts ...Part) (items []Item, total uint64) {
	idx := map[string]int{}
	var present [][]bool
	for pi, p := range parts {
		total += p.Total
		for _, it := range p.Items {
			i, ok := idx[it.Value]
			if !ok {
				i = len(items)
				idx[it.Value] = i
				items = append(items, Item{Value: it.Value, Descriptor: it.Descriptor})
				present = append(present, make([]bool, len(parts)))
			}
			items[i].Count += it.Count
			items[i].Err += it.Err
			if items[i].Descriptor == "" {
				items[i].Descriptor = it.Descriptor
			}
			present[i][pi] = true
		}
	}
	for i := range items {
		for pi, p := range parts {
			if !present[i][pi] {
				items[i].Count += p.Floor
				items[i].Err += p.Floor
			}
		}
	}
	sortItems(items)
	return items, total
}
