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

// appendCompact appends a policy's compact form (tiers.Policy.AppendCompact)
// as a msgpack array: the integers as they are, math.MaxInt64 (Unbounded) as
// +Inf, which is math.huge to the function.
func appendCompact(b []byte, v []int64) []byte {
	b = appendArray(b, len(v))
	for _, x := range v {
		if x == math.MaxInt64 {
			b = append(b, 0xcb)
			b = binary.BigEndian.AppendUint64(b, math.Float64bits(math.Inf(1)))
			continue
		}
		b = appendInt(b, x)
	}
	return b
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

// encoded is a policy as the function reads it: its compact form
// (tiers.Policy.AppendCompact) as a msgpack array, in a string.
// A calendar quota's form carries the boundaries of the periods around the
// now it was made at; it serves while now stays in the period [from,
// until) it was made in.
type encoded struct {
	arg         any
	from, until int64
	// undo: a take of the policy can be given back exactly (undoableTake).
	undo bool
}

func encodePolicy(p *tiers.Policy, now time.Time) *encoded {
	v := p.AppendCompactAt(nil, now)
	e := &encoded{arg: string(appendCompact(nil, v)), undo: undoableTake(p)}
	if p.Kind == tiers.KindQuota && len(v) == 3+tiers.QuotaTableLen {
		e.from, e.until = v[5], v[6]
	}
	return e
}

// current reports whether e is p's form at now.
func (e *encoded) current(p *tiers.Policy, now time.Time) bool {
	if p.Kind != tiers.KindQuota {
		return true
	}
	t := now.UnixMicro()
	return e.from <= t && t < e.until
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

func (c *policyCache) get(p *tiers.Policy, now time.Time) *encoded {
	if v, ok := c.m.Load(p); ok && v.(*encoded).current(p, now) {
		return v.(*encoded)
	}
	e := encodePolicy(p, now)
	if c.n.Add(1) > maxPolicies {
		c.m.Clear()
		c.n.Store(1)
	}
	c.m.Store(p, e)
	return e
}

// decision reads the function's answer for an item of policy p and
// completes it with what follows from the policy.
func decision(p *tiers.Policy, r *reader) tiers.Decision {
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
	d.RetryAfter = tiers.FromMicros(r.num())
	d.ResetAfter = tiers.FromMicros(r.num())
	p.FillLimits(&d)
	return d
}
