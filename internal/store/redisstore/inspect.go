package redisstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
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
	// A fixed window's count is read with its key's expiry (countInts).
	pipe := s.c.Pipeline()
	mget := pipe.MGet(ctx, keys...)
	var exp *redis.DurationCmd
	if it.Policy.Kind == tiers.KindFixedWindow {
		exp = pipe.PExpireTime(ctx, sk)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return tiers.View{}, fmt.Errorf("redisstore: %w", err)
	}
	vals := mget.Val()
	var st tiers.State
	var v []int64
	var err error
	if str, ok := vals[0].(string); ok && exp != nil && isCount(str) {
		v, err = countInts(str, exp.Val(), now, it.Policy.Window.Unit.Length())
	} else {
		v, err = blobInts(vals[0])
	}
	if len(v) > 0 && v[0] == tiers.QuotaCompact && it.Policy.Kind == tiers.KindQuota {
		// The function keeps a quota's state under its compact kind (3
		// is a closed policy's there).
		v[0] = int64(tiers.KindQuota)
	}
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

// isCount reports whether str is a fixed window's count as the decide library
// writes it: a decimal integer.
func isCount(str string) bool {
	if str == "" || len(str) > 19 {
		return false
	}
	for i := range len(str) {
		if str[i] < '0' || str[i] > '9' {
			return false
		}
	}
	return true
}

// countInts is the compact form (kind, used, window start, count) of a
// fixed window's count str at a key expiring at expiry (since the epoch, or
// negative when the key has none) for windows of length l: the count is
// that of the window containing now when the expiry is after that window's
// start, of a later window when it is past that window's end (state.lua's
// cwin), else the state is fresh.
func countInts(str string, expiry time.Duration, now time.Time, l time.Duration) ([]int64, error) {
	n, err := strconv.ParseInt(str, 10, 64)
	if err != nil || l <= 0 {
		return nil, errBlob
	}
	w := l.Microseconds()
	start, e := floorTo(now.UnixMicro(), w), expiry.Microseconds()
	if expiry < 0 || e <= start {
		return nil, nil
	}
	if e > start+w {
		// A later window's (the clock went back): the one holding the
		// instant before the expiry.
		start = floorTo(e-1, w)
	}
	return []int64{int64(tiers.KindFixedWindow), 1, start, n}, nil
}

// floorTo returns the largest multiple of w (> 0) not above x.
func floorTo(x, w int64) int64 { return x - ((x%w)+w)%w }

// errBlob is a state blob that the decide library does not write.
var errBlob = errors.New("not a state blob")

// The tags of the decide library's tiers and global states, strings of big-endian
// doubles.
const (
	tagTiers  = 5
	tagGlobal = 11
)

// blobInts decodes a state blob as the decide library writes it into the compact
// form of package tiers (State.SetCompact, Global.SetCompact). A tiers
// state (tag 5: n, the second log's hits and m, then per tier in, entered,
// hits and m, then the logs' records) or a global state (tag 11: hits, m,
// records) is a string of big-endian doubles, whose logs become m, then m
// pairs (start, count); a bucket state, or a fixed-window state of the
// earlier layout, is a msgpack array holding that form as it is (a count,
// the current fixed-window layout, is read by countInts). A missing key
// (nil), or a blob of an earlier layout (a msgpack array tagged 0, 4, 9 or
// 10), is an empty array: a fresh state, as the decide library reads it.
func blobInts(v any) ([]int64, error) {
	if v == nil {
		return nil, nil
	}
	str, ok := v.(string)
	if !ok {
		return nil, errBlob
	}
	if len(str) >= 8 && str[0] == 0x40 {
		return rawInts([]byte(str))
	}
	n, b, ok := msgpackArray([]byte(str))
	if !ok || n == 0 {
		return nil, errBlob
	}
	out := make([]int64, 0, n)
	for i := range n {
		var x int64
		if x, b, ok = msgpackInt(b); !ok {
			return nil, errBlob
		}
		if i == 0 && x != int64(tiers.KindTokenBucket) && x != int64(tiers.KindFixedWindow) && x != tiers.ClosedCompact && (x != tiers.QuotaCompact || (n != 4 && n != 6)) {
			return nil, nil // an earlier layout (tags 0, 4 of other lengths, 9, 10)
		}
		out = append(out, x)
	}
	if len(b) != 0 {
		return nil, errBlob
	}
	return out, nil
}

// rawInts decodes a tiers or global state string (blobInts).
func rawInts(b []byte) ([]int64, error) {
	if len(b)%8 != 0 {
		return nil, errBlob
	}
	r := rawReader{b: b}
	var out []int64
	switch r.next() {
	case tagTiers:
		nt := r.next()
		if nt < 0 || nt > tiers.MaxTiers {
			return nil, errBlob
		}
		sum, m := r.next(), r.next()
		head := make([]int64, 0, 4*nt)
		for range 4 * nt {
			head = append(head, r.next())
		}
		out = r.log(append(out, int64(tiers.KindTiers)), sum, m)
		out = append(out, nt)
		for i := range nt {
			h := head[4*i:]
			out = r.log(append(out, h[0], h[1]), h[2], h[3])
		}
	case tagGlobal:
		sum, m := r.next(), r.next()
		out = r.log(append(out, tiers.GlobalCompact), sum, m)
	default:
		return nil, nil
	}
	if r.bad || len(r.b) != 0 {
		return nil, errBlob
	}
	return out, nil
}

// rawReader reads a state string's doubles, each an integer; bad is set at
// the first that is missing or not one.
type rawReader struct {
	b   []byte
	bad bool
}

func (r *rawReader) next() int64 {
	if len(r.b) < 8 {
		r.bad = true
		return 0
	}
	x, ok := integral(math.Float64frombits(binary.BigEndian.Uint64(r.b)))
	r.b = r.b[8:]
	r.bad = r.bad || !ok
	return x
}

// integral is f as an int64 when it is a whole number within int64's range.
func integral(f float64) (int64, bool) {
	if f != math.Trunc(f) || f < math.MinInt64 || f >= math.MaxInt64 {
		return 0, false
	}
	return int64(f), true
}

// log appends a log of m records whose counts sum to sum as m, then m
// pairs.
func (r *rawReader) log(dst []int64, sum, m int64) []int64 {
	if m < 0 || m > int64(len(r.b)/16) {
		r.bad = true
		return dst
	}
	dst = append(dst, m)
	var got int64
	for range m {
		at, n := r.next(), r.next()
		dst = append(dst, at, n)
		got += n
	}
	if got != sum {
		r.bad = true
	}
	return dst
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
	x, ok := integral(f)
	return x, rest, ok
}
