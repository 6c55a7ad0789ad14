package redisstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/tiers"
)

var _ store.Inspector = (*Store)(nil)

// Inspect implements store.Inspector with one read-only command (MGET of the
// pair's state key and, with a global limit, its resource's global key, which
// share a slot). The view is taken at now, the caller's clock, also under
// ClockRedis.
func (s *Store) Inspect(ctx context.Context, now time.Time, it *store.Item) (tiers.View, error) {
	if s.closed.Load() {
		return tiers.View{}, store.ErrClosed
	}
	if it.Policy == nil {
		return tiers.View{}, fmt.Errorf("%w: no policy", store.ErrBadItem)
	}
	sk, gk := stateKey(s.prefix, it)
	keys := []string{sk}
	if gk != "" {
		keys = append(keys, gk)
	}
	vals, err := s.c.MGet(ctx, keys...).Result()
	if err != nil {
		return tiers.View{}, fmt.Errorf("redisstore: %w", err)
	}
	var st tiers.State
	v, err := blobInts(vals[0])
	if err == nil {
		err = st.SetCompact(it.Policy, v)
	}
	if err != nil {
		return tiers.View{}, fmt.Errorf("redisstore: state of %s: %w", sk, err)
	}
	var g *tiers.Global
	if gk != "" {
		g = new(tiers.Global)
		v, err := blobInts(vals[1])
		if err == nil {
			err = g.SetCompact(v)
		}
		if err != nil {
			return tiers.View{}, fmt.Errorf("redisstore: global state %s: %w", gk, err)
		}
	}
	return tiers.Inspect(it.Policy, &st, g, now), nil
}

// Reset implements store.Inspector: it deletes the pair's state key.
func (s *Store) Reset(ctx context.Context, it *store.Item) error {
	if s.closed.Load() {
		return store.ErrClosed
	}
	if it.Policy == nil {
		return fmt.Errorf("%w: no policy", store.ErrBadItem)
	}
	sk, _ := stateKey(s.prefix, it)
	if err := s.c.Del(ctx, sk).Err(); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("redisstore: %w", err)
	}
	return nil
}

// errBlob is a state blob that decide.lua does not write.
var errBlob = errors.New("not a state blob")

// The tags of decide.lua's tiers and global blobs, whose logs are stored as
// hits and a string of buckets.
const (
	tagTiers  = 4
	tagGlobal = 10
)

// blobInts decodes a state blob as decide.lua writes it (a msgpack array
// whose first element is its tag) into the compact form of package tiers
// (State.SetCompact, Global.SetCompact). Bucket and fixed-window blobs hold
// that form as they are; in tiers and global blobs each log is two values,
// its hits and a string of 16-byte buckets (start, count: big-endian
// doubles), which become m, then m pairs. A missing key (nil), or a tiers
// or global blob of an earlier layout (tags 0 and 9), is an empty array: a
// fresh state, as decide.lua reads it.
func blobInts(v any) ([]int64, error) {
	if v == nil {
		return nil, nil
	}
	str, ok := v.(string)
	if !ok {
		return nil, errBlob
	}
	n, b, ok := msgpackArray([]byte(str))
	if !ok || n == 0 {
		return nil, errBlob
	}
	r := blobReader{b: b, left: n}
	tag := r.int()
	var out []int64
	switch tag {
	case int64(tiers.KindTiers), tiers.GlobalCompact:
		return nil, nil
	case tagTiers:
		out = r.log(append(out, int64(tiers.KindTiers)))
		nt := r.int()
		out = append(out, nt)
		for i := int64(0); i < nt && !r.bad; i++ {
			out = r.log(append(out, r.int(), r.int()))
		}
	case tagGlobal:
		out = r.log(append(out, tiers.GlobalCompact))
	default:
		out = append(out, tag)
		for r.left > 0 && !r.bad {
			out = append(out, r.int())
		}
	}
	if r.bad || r.left != 0 || len(r.b) != 0 {
		return nil, errBlob
	}
	return out, nil
}

// blobReader reads the elements of a msgpack array, left of them, from b;
// bad is set at the first that is not what was asked for.
type blobReader struct {
	b    []byte
	left int
	bad  bool
}

func (r *blobReader) int() int64 {
	if r.bad || r.left == 0 {
		r.bad = true
		return 0
	}
	x, rest, ok := msgpackInt(r.b)
	r.b, r.left, r.bad = rest, r.left-1, !ok
	return x
}

// log appends a stored log (hits, buckets) to dst as m, then m pairs.
func (r *blobReader) log(dst []int64) []int64 {
	r.int() // the hits: the sum of the pairs' counts
	if r.bad || r.left == 0 {
		r.bad = true
		return dst
	}
	s, rest, ok := msgpackString(r.b)
	r.b, r.left = rest, r.left-1
	if !ok || len(s)%16 != 0 {
		r.bad = true
		return dst
	}
	dst = append(dst, int64(len(s)/16))
	for i := 0; i < len(s); i += 8 {
		f := math.Float64frombits(binary.BigEndian.Uint64(s[i:]))
		if f != math.Trunc(f) || f < math.MinInt64 || f >= math.MaxInt64 {
			r.bad = true
			return dst
		}
		dst = append(dst, int64(f))
	}
	return dst
}

// msgpackString reads one string (str or bin).
func msgpackString(b []byte) ([]byte, []byte, bool) {
	if len(b) == 0 {
		return nil, nil, false
	}
	n, hdr := 0, 0
	switch c := b[0]; {
	case c&0xe0 == 0xa0:
		n, hdr = int(c&0x1f), 1
	case (c == 0xd9 || c == 0xc4) && len(b) >= 2:
		n, hdr = int(b[1]), 2
	case (c == 0xda || c == 0xc5) && len(b) >= 3:
		n, hdr = int(binary.BigEndian.Uint16(b[1:])), 3
	case (c == 0xdb || c == 0xc6) && len(b) >= 5:
		n, hdr = int(binary.BigEndian.Uint32(b[1:])), 5
	default:
		return nil, nil, false
	}
	if len(b)-hdr < n {
		return nil, nil, false
	}
	return b[hdr : hdr+n], b[hdr+n:], true
}

func msgpackArray(b []byte) (int, []byte, bool) {
	switch {
	case len(b) >= 1 && b[0]&0xf0 == 0x90:
		return int(b[0] & 0x0f), b[1:], true
	case len(b) >= 3 && b[0] == 0xdc:
		return int(binary.BigEndian.Uint16(b[1:])), b[3:], true
	case len(b) >= 5 && b[0] == 0xdd:
		n := binary.BigEndian.Uint32(b[1:])
		if int64(n) > int64(len(b)) {
			return 0, nil, false
		}
		return int(n), b[5:], true
	}
	return 0, nil, false
}

// msgpackInt reads one number; a double must be integral and within int64.
func msgpackInt(b []byte) (int64, []byte, bool) {
	if len(b) == 0 {
		return 0, nil, false
	}
	c := b[0]
	switch {
	case c <= 0x7f:
		return int64(c), b[1:], true
	case c >= 0xe0:
		return int64(int8(c)), b[1:], true
	}
	var size int
	switch c {
	case 0xcc, 0xd0:
		size = 1
	case 0xcd, 0xd1:
		size = 2
	case 0xce, 0xd2, 0xca:
		size = 4
	case 0xcf, 0xd3, 0xcb:
		size = 8
	}
	if size == 0 || len(b) < 1+size {
		return 0, nil, false
	}
	p, rest := b[1:1+size], b[1+size:]
	switch c {
	case 0xcc:
		return int64(p[0]), rest, true
	case 0xcd:
		return int64(binary.BigEndian.Uint16(p)), rest, true
	case 0xce:
		return int64(binary.BigEndian.Uint32(p)), rest, true
	case 0xcf:
		u := binary.BigEndian.Uint64(p)
		return int64(u), rest, u <= math.MaxInt64
	case 0xd0:
		return int64(int8(p[0])), rest, true
	case 0xd1:
		return int64(int16(binary.BigEndian.Uint16(p))), rest, true
	case 0xd2:
		return int64(int32(binary.BigEndian.Uint32(p))), rest, true
	case 0xd3:
		return int64(binary.BigEndian.Uint64(p)), rest, true
	}
	var f float64
	if c == 0xca {
		f = float64(math.Float32frombits(binary.BigEndian.Uint32(p)))
	} else {
		f = math.Float64frombits(binary.BigEndian.Uint64(p))
	}
	if f != math.Trunc(f) || f < math.MinInt64 || f >= math.MaxInt64 {
		return 0, nil, false
	}
	return int64(f), rest, true
}
