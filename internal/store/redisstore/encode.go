package redisstore

import (
	"encoding/binary"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/charonlimit/charon/tiers"
)

// The function's arguments are big-endian doubles (exact for the integers
// below 2^53 it works with; larger counts are clamped by it anyway), and
// so are its replies (+Inf stands for Unbounded). Policies are msgpack
// arrays of integers (Redis's cmsgpack reads them exactly up to 2^53),
// decoded by the function once per policy.

func appendArray(b []byte, n int) []byte {
	switch {
	case n < 16:
		return append(b, 0x90|byte(n))
	case n < 1<<16:
		return append(b, 0xdc, byte(n>>8), byte(n))
	default:
		return append(b, 0xdd, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	}
}

func appendInt(b []byte, v int64) []byte {
	switch {
	case v >= 0 && v < 128:
		return append(b, byte(v))
	case v < 0 && v >= -32:
		return append(b, byte(v))
	case v >= 0 && v < 1<<16:
		return append(b, 0xcd, byte(v>>8), byte(v))
	case v >= 0 && v < 1<<32:
		return append(b, 0xce, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	}
	b = append(b, 0xd3)
	return binary.BigEndian.AppendUint64(b, uint64(v))
}

// appendMicros appends a count of µs, +Inf for Unbounded (math.MaxInt64).
func appendMicros(b []byte, us int64) []byte {
	if us == math.MaxInt64 {
		b = append(b, 0xcb)
		return binary.BigEndian.AppendUint64(b, math.Float64bits(math.Inf(1)))
	}
	return appendInt(b, us)
}

// appendF64 appends v as a big-endian double, rounded as Lua would round
// it.
func appendF64(b []byte, v int64) []byte {
	return binary.BigEndian.AppendUint64(b, math.Float64bits(float64(v)))
}

var errReply = errors.New("redisstore: malformed function reply")

// reader decodes the function's reply, a sequence of big-endian doubles.
type reader struct {
	b   string
	err error
}

// num returns the next number; +Inf (and any number too large to be a
// count of µs) is returned as math.MaxInt64.
func (r *reader) num() int64 {
	if r.err != nil || len(r.b) < 8 {
		r.err = errReply
		return 0
	}
	u := uint64(r.b[0])<<56 | uint64(r.b[1])<<48 | uint64(r.b[2])<<40 | uint64(r.b[3])<<32 |
		uint64(r.b[4])<<24 | uint64(r.b[5])<<16 | uint64(r.b[6])<<8 | uint64(r.b[7])
	r.b = r.b[8:]
	return floatMicros(math.Float64frombits(u))
}

func floatMicros(f float64) int64 {
	if f >= math.MaxInt64 || math.IsInf(f, 1) {
		return math.MaxInt64
	}
	if f <= math.MinInt64 || math.IsNaN(f) {
		return math.MinInt64
	}
	return int64(f)
}

// duration converts µs from the script to a Duration like package tiers
// does: math.MaxInt64 (+Inf) and anything too long become Unbounded.
func duration(us int64) time.Duration {
	if us >= math.MaxInt64/int64(time.Microsecond) {
		return tiers.Unbounded
	}
	return time.Duration(us) * time.Microsecond
}

func micros(d time.Duration) int64 {
	if d == tiers.Unbounded {
		return math.MaxInt64
	}
	return d.Microseconds()
}

func ceilDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 {
		q++
	}
	return q
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// Policy kinds of the script.
const (
	kindTiers  = 0
	kindBucket = 1
	kindFixed  = 2
	kindClosed = 3
)

// encoded is a policy as the script reads it, with what the Go side needs to
// complete a decision (TierLimit and TierWindow of a bucket or a window).
type encoded struct {
	arg    any // the msgpack array, as a string
	kind   int
	limit  int64         // bucket capacity, window limit
	window time.Duration // time to refill the bucket, window length
}

// encodePolicy encodes p for the script. Policies the tiers package would
// answer as closed (an invalid bucket or window, an unknown kind) are
// encoded as closed.
func encodePolicy(p *tiers.Policy) *encoded {
	var b []byte
	e := &encoded{kind: kindClosed}
	switch p.Kind {
	case tiers.KindTiers:
		e.kind = kindTiers
		n := min(len(p.Tiers), tiers.MaxTiers)
		b = appendArray(b, 6+6*n)
		b = appendInt(b, kindTiers)
		b = appendInt(b, p.HardLimit)
		b = appendInt(b, p.GlobalLimit)
		b = appendInt(b, secondWidth(p.HardLimit))
		b = appendInt(b, secondWidth(p.GlobalLimit))
		b = appendInt(b, int64(n))
		for _, t := range p.Tiers[:n] {
			win := micros(t.Window)
			b = appendInt(b, t.Limit)
			b = appendMicros(b, win)
			b = appendMicros(b, micros(t.Active))
			b = appendMicros(b, max(0, micros(t.Cooldown)))
			if t.Skippable {
				b = appendInt(b, 1)
			} else {
				b = appendInt(b, 0)
			}
			b = appendInt(b, tierWidth(t.Limit, win))
		}
	case tiers.KindTokenBucket:
		unit, r, capU, ok := bucketUnits(&p.Bucket)
		if !ok {
			break
		}
		e.kind, e.limit, e.window = kindBucket, p.Bucket.Capacity, duration(ceilDiv(capU, r))
		b = appendArray(b, 5)
		b = appendInt(b, kindBucket)
		b = appendInt(b, unit)
		b = appendInt(b, r)
		b = appendInt(b, capU)
		b = appendInt(b, p.Bucket.Capacity)
	case tiers.KindFixedWindow:
		secs := unitSeconds(p.Window.Unit)
		if secs == 0 || p.Window.Limit < 1 {
			break
		}
		e.kind, e.limit, e.window = kindFixed, p.Window.Limit, time.Duration(secs)*time.Second
		b = appendArray(b, 3)
		b = appendInt(b, kindFixed)
		b = appendInt(b, p.Window.Limit)
		b = appendInt(b, secs*1_000_000)
	}
	if e.kind == kindClosed {
		b = appendArray(b[:0], 1)
		b = appendInt(b, kindClosed)
	}
	e.arg = string(b)
	return e
}

// The widths of package tiers' hit logs (tiers/state.go).
func tierWidth(limit, window int64) int64 {
	if limit <= 64 {
		return 1
	}
	return max(1, ceilDiv(window, 64))
}

func secondWidth(limit int64) int64 {
	if limit >= 1 && limit <= 64 {
		return 1
	}
	return 1_000_000 / 64
}

// bucketUnits is tiers' fixed-point form of a token bucket.
func bucketUnits(b *tiers.TokenBucket) (p, r, capU int64, ok bool) {
	per := micros(b.Per)
	if b.Capacity < 1 || b.Refill < 1 || per < 1 || per == math.MaxInt64 {
		return 0, 0, 0, false
	}
	g := gcd(b.Refill, per)
	p, r = per/g, b.Refill/g
	if b.Capacity > (1<<53)/p {
		return 0, 0, 0, false
	}
	return p, r, b.Capacity * p, true
}

func unitSeconds(u tiers.Unit) int64 {
	switch u {
	case tiers.UnitSecond:
		return 1
	case tiers.UnitMinute:
		return 60
	case tiers.UnitHour:
		return 3600
	case tiers.UnitDay:
		return 86400
	case tiers.UnitWeek:
		return 604800
	case tiers.UnitMonth:
		return 2592000
	case tiers.UnitYear:
		return 31536000
	}
	return 0
}

// policyCache maps a *tiers.Policy (immutable once in use) to its encoding.
// It is keyed by pointer, not PolicyID: one PolicyID covers a policy and its
// per-domain overrides. It is emptied when it exceeds maxPolicies entries,
// so the policies of old configs do not accumulate.
type policyCache struct {
	m sync.Map // *tiers.Policy -> *encoded
	n atomic.Int64
}

const maxPolicies = 1 << 14

func (c *policyCache) get(p *tiers.Policy) *encoded {
	if v, ok := c.m.Load(p); ok {
		return v.(*encoded)
	}
	e := encodePolicy(p)
	if c.n.Add(1) > maxPolicies {
		c.m.Clear()
		c.n.Store(1)
	}
	c.m.Store(p, e)
	return e
}

// decision completes the script's numbers for an item of policy p.
func decision(p *tiers.Policy, e *encoded, r *reader) tiers.Decision {
	flags := r.num()
	d := tiers.Decision{
		Granted:         r.num(),
		OK:              flags&1 != 0,
		Burst:           flags&2 != 0,
		LimitedByHard:   flags&4 != 0,
		LimitedByGlobal: flags&8 != 0,
	}
	d.Tier = int(r.num())
	d.TierHits = r.num()
	d.DomainHits = r.num()
	d.ResourceHits = r.num()
	d.Remaining = r.num()
	d.RetryAfter = duration(r.num())
	d.ResetAfter = duration(r.num())
	switch e.kind {
	case kindTiers:
		d.HardLimit, d.GlobalLimit = p.HardLimit, p.GlobalLimit
		if d.Tier >= 1 && d.Tier <= len(p.Tiers) {
			d.TierLimit, d.TierWindow = p.Tiers[d.Tier-1].Limit, p.Tiers[d.Tier-1].Window
		}
	case kindBucket, kindFixed:
		if d.Tier == 1 {
			d.TierLimit, d.TierWindow = e.limit, e.window
		}
	}
	return d
}
