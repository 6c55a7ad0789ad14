package descriptors

import (
	"encoding/binary"
	"hash/fnv"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/charonlimit/charon/tiers"
)

// MaxKeyLen bounds the length in bytes of Match.Resource and Match.Domain.
// A longer identity keeps its first MaxKeyLen-17 bytes followed by "~" and
// the 16 hex digits of the FNV-1a 64-bit hash of the whole escaped string.
const MaxKeyLen = 256

const hexDigits = "0123456789ABCDEF"

// unsafeByte marks the bytes escaped as %XX in identities: controls, space,
// non-ASCII, and the separators of identities and of Redis key conventions.
var unsafeByte = func() (t [256]bool) {
	for b := 0; b < 256; b++ {
		t[b] = b <= ' ' || b >= 0x7f
	}
	for _, b := range []byte(`%/=,:{}~"\`) {
		t[b] = true
	}
	return t
}()

// escapedLen is the length of s once escaped.
func escapedLen(s string) int {
	n := len(s)
	for i := 0; i < len(s); i++ {
		if unsafeByte[s[i]] {
			n += 2
		}
	}
	return n
}

// appendEscaped appends s escaped to b.
func appendEscaped(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if unsafeByte[c] {
			b = append(b, '%', hexDigits[c>>4], hexDigits[c&15])
		} else {
			b = append(b, c)
		}
	}
	return b
}

// Escape returns s with every byte outside the safe set written %XX (upper
// case hex), as Resource and Domain parts are. It is how an override's
// domain is written when a request value holds a separator.
func Escape(s string) string {
	if escapedLen(s) == len(s) {
		return s
	}
	return string(appendEscaped(make([]byte, 0, escapedLen(s)), s))
}

// Bound returns s cut to MaxKeyLen with a hash of the whole, when longer:
// how every Match.Resource and Match.Domain is bounded, and how the engine
// bounds the resource of a request's own limit.
func Bound(s string) string {
	if len(s) <= MaxKeyLen {
		return s
	}
	h := fnv.New64a()
	h.Write([]byte(s))
	b := make([]byte, 0, MaxKeyLen)
	b = append(b, s[:MaxKeyLen-17]...)
	b = append(b, '~')
	b = appendHex(b, h.Sum64())
	return string(b)
}

func appendHex(b []byte, v uint64) []byte {
	for i := 60; i >= 0; i -= 4 {
		b = append(b, hexDigits[(v>>uint(i))&15])
	}
	return b
}

// PolicyID returns the stable hash that Limit.ID holds for this policy set.
// Overrides and Copies may be nil.
func PolicyID(p *tiers.Policy, overrides map[string]*tiers.Policy, c *Copies) uint64 {
	h := fnv.New64a()
	var buf []byte
	buf = appendPolicy(buf, p)
	keys := make([]string, 0, len(overrides))
	for k := range overrides {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	buf = binary.AppendUvarint(buf, uint64(len(keys)))
	for _, k := range keys {
		buf = appendString(buf, k)
		buf = appendPolicy(buf, overrides[k])
	}
	if c == nil {
		buf = append(buf, 0)
	} else {
		buf = append(buf, 1)
		buf = binary.AppendVarint(buf, c.DomainLimit)
		buf = binary.AppendVarint(buf, c.GlobalLimit)
		buf = binary.AppendUvarint(buf, uint64(len(c.Groups)))
		for _, g := range c.Groups {
			buf = appendString(buf, g.Name)
			buf = binary.AppendVarint(buf, g.Limit)
			buf = binary.AppendUvarint(buf, uint64(len(g.Members)))
			for _, m := range g.Members {
				buf = appendString(buf, m)
			}
		}
		ok := make([]string, 0, len(c.Overrides))
		for k := range c.Overrides {
			ok = append(ok, k)
		}
		slices.Sort(ok)
		buf = binary.AppendUvarint(buf, uint64(len(ok)))
		for _, k := range ok {
			buf = appendString(buf, k)
			buf = binary.AppendVarint(buf, c.Overrides[k])
		}
	}
	h.Write(buf)
	id := h.Sum64()
	if id == 0 {
		id = 1 // 0 means "not computed"
	}
	return id
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendPolicy(b []byte, p *tiers.Policy) []byte {
	if p == nil {
		return append(b, 0)
	}
	b = append(b, 1, byte(p.Kind))
	switch p.Kind {
	case tiers.KindTiers:
		b = binary.AppendVarint(b, p.HardLimit)
		b = binary.AppendVarint(b, p.GlobalLimit)
		b = binary.AppendUvarint(b, uint64(len(p.Tiers)))
		for _, t := range p.Tiers {
			b = binary.AppendVarint(b, t.Limit)
			b = binary.AppendVarint(b, int64(t.Window))
			b = binary.AppendVarint(b, int64(t.Active))
			b = binary.AppendVarint(b, int64(t.Cooldown))
			if t.Skippable {
				b = append(b, 1)
			} else {
				b = append(b, 0)
			}
		}
	case tiers.KindTokenBucket:
		b = binary.AppendVarint(b, p.Bucket.Capacity)
		b = binary.AppendVarint(b, p.Bucket.Refill)
		b = binary.AppendVarint(b, int64(p.Bucket.Per))
	case tiers.KindFixedWindow:
		b = binary.AppendVarint(b, p.Window.Limit)
		b = append(b, byte(p.Window.Unit))
	case tiers.KindQuota:
		q := &p.Quota
		b = binary.AppendVarint(b, q.Limit)
		b = append(b, byte(q.Period))
		if q.Location != nil {
			b = append(b, q.Location.String()...)
		}
		b = append(b, 0)
		if !q.Anchor.IsZero() {
			b = binary.AppendVarint(b, q.Anchor.UnixMicro())
		}
	default:
		b = strconv.AppendUint(b, math.MaxUint64, 16)
	}
	if p.Overdraft {
		// Only when set: an admission policy keeps the ID (and so the
		// state) it had before post-paid counting existed.
		b = append(b, 'o')
	}
	if p.Concurrency {
		b = append(b, 'c') // likewise
	}
	return b
}

// ParseResource reads a rule's path back from a resource of the RLS domain
// rls, as Match.Resource and Leaf.Resource write it: the keys with their
// configured values (a fixed value or a wildcard pattern; "" for a key
// alone). ok is false when resource is not of rls, is not escaped as
// Escape writes, or was cut to its bound (Bound), which cannot be undone.
func ParseResource(rls, resource string) (path []Entry, ok bool) {
	rest, ok := strings.CutPrefix(resource, Escape(rls)+"/")
	if !ok || rest == "" || strings.IndexByte(resource, '~') >= 0 {
		return nil, false
	}
	for _, part := range strings.Split(rest, "/") {
		k, v, _ := strings.Cut(part, "=")
		key, ok1 := unescape(k)
		val, ok2 := unescape(v)
		if !ok1 || !ok2 || key == "" {
			return nil, false
		}
		path = append(path, Entry{Key: key, Value: val})
	}
	return path, true
}

// unescape undoes Escape.
func unescape(s string) (string, bool) {
	if strings.IndexByte(s, '%') < 0 {
		return s, true
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b = append(b, s[i])
			continue
		}
		if i+2 >= len(s) {
			return "", false
		}
		hi, lo := strings.IndexByte(hexDigits, s[i+1]), strings.IndexByte(hexDigits, s[i+2])
		if hi < 0 || lo < 0 {
			return "", false
		}
		b = append(b, byte(hi<<4|lo))
		i += 2
	}
	return string(b), true
}
