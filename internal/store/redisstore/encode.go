package redisstore

import (
	"encoding/binary"
	"errors"
	"fmt"
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

// Modes of a call of the decide function (header.mode; apply.lua's
// "Modes").
const (
	modeDecide  = 1 // decide and apply
	modeChecked = 2 // decide and apply unless a key is locked (Cluster)
	modePrepare = 3 // lock the keys, decide without writing
	modeCommit  = 4 // finish a prepare: apply, release the locks
	modeAbort   = 5 // finish a prepare: refunds and post-paid debits only
	modeRelease = 6 // release the token's locks
	modeSeal    = 7 // extend the token's locks to the lease, if it holds them all
	modeUndo    = 8 // give back grants of modes 1 and 2 (oneTrip, backFor)
)

// Statuses of a reply (its first double).
const (
	statusDone = 0
	statusBusy = 1 // a key was locked: nothing done
	statusLost = 2 // a lock of the token was lost: nothing done
)

// header is ARGV[1] of a call of the decide function: what the call asks of
// Redis besides its keys and policies. append writes it and parseHeader
// reads it; no other Go code lays out its bytes. The layout (apply.lua's
// "ARGV[1]"), big-endian doubles: mode, now, maxTTL, lease (newest in mode
// undo), nk and the number of items; per item six (key, global, policy,
// hits, min, flags); per item two, the plan (lead, glob); then off when it
// is not 0. Every number is an integer, exact below 2^53 as a double.
type header struct {
	mode int64
	// now is the call's instant in µs on the caller's clock, or -1 for
	// Redis's clock (the master's TIME, read by the function).
	now int64
	// maxTTL caps every key's time to live (ms).
	maxTTL int64
	// lease is the life of the locks a prepare or a seal sets (ms).
	lease int64
	// newest (mode undo, in lease's place): the grants given back were
	// made on a caller's clock with no call on their keys since, so they
	// are in their logs' newest buckets, even when that clock went back.
	newest bool
	// nk is the number of state and global keys, KEYS[1..nk]; in the lock
	// modes (all but decide and undo) KEYS[nk+i] is the lock key of KEYS[i].
	nk    int
	items []headerItem
	// off follows the plan: a reservation's offset in µs (> 0), or minus
	// the instant a give-back gives back a reservation made for (< 0).
	// 0 is sent as nothing.
	off int64
}

// headerItem is one item of a header.
type headerItem struct {
	key    int // its state key is KEYS[key] (from 1)
	global int // its resource's global state is KEYS[global]; 0 for none
	policy int // its policy is ARGV[2+policy] (from 1)
	hits   int64
	min    int64
	// The flags: a refund (store.Item.Refund), shadow (store.Item.Shadow),
	// and in mode undo whether the grant given back entered its tier
	// (tiers.Decision.Burst).
	refund, shadow, entered bool
	// The plan (store.Plan), for the general code: lead is the item (from
	// 1) leading its group, 0 for a refund; glob the leader of the first
	// group sharing its global state, 0 for none.
	lead, glob int
}

// The bits of headerItem's flags.
const (
	flagRefund  = 1
	flagShadow  = 2
	flagEntered = 4
)

// The doubles of a header: before the items, per item, per item in the
// plan.
const hdrFields, itemFields, planFields = 6, 6, 2

// append appends h's encoding to b.
func (h *header) append(b []byte) []byte {
	lease := h.lease
	if h.mode == modeUndo {
		lease = 0
		if h.newest {
			lease = 1
		}
	}
	for _, v := range [hdrFields]int64{h.mode, h.now, h.maxTTL, lease, int64(h.nk), int64(len(h.items))} {
		b = appendF64(b, v)
	}
	for i := range h.items {
		it := &h.items[i]
		var f int64
		if it.refund {
			f |= flagRefund
		}
		if it.shadow {
			f |= flagShadow
		}
		if it.entered {
			f |= flagEntered
		}
		for _, v := range [itemFields]int64{int64(it.key), int64(it.global), int64(it.policy), it.hits, it.min, f} {
			b = appendF64(b, v)
		}
	}
	for i := range h.items {
		b = appendF64(appendF64(b, int64(h.items[i].lead)), int64(h.items[i].glob))
	}
	if h.off != 0 {
		b = appendF64(b, h.off)
	}
	return b
}

// errHeader is a header that append does not write.
var errHeader = errors.New("redisstore: malformed call header")

// parseHeader reads a header that append wrote; the error names the first
// field that append would not have written.
func parseHeader(b []byte) (header, error) {
	var h header
	if len(b)%8 != 0 || len(b) < 8*hdrFields {
		return h, fmt.Errorf("%w: %d bytes", errHeader, len(b))
	}
	r := headerReader{b: b}
	h.mode, h.now, h.maxTTL, h.lease = r.next("mode"), r.next("now"), r.next("maxTTL"), r.next("lease")
	nk, n := r.next("nk"), r.next("items")
	if r.err != nil {
		return header{}, r.err
	}
	switch {
	case h.mode < modeDecide || h.mode > modeUndo:
		return header{}, fmt.Errorf("%w: mode %d", errHeader, h.mode)
	case h.now < -1:
		return header{}, fmt.Errorf("%w: now %d", errHeader, h.now)
	case h.mode == modeUndo && h.lease != 0 && h.lease != 1:
		return header{}, fmt.Errorf("%w: newest %d", errHeader, h.lease)
	case nk < 0:
		return header{}, fmt.Errorf("%w: nk %d", errHeader, nk)
	case n < 0:
		return header{}, fmt.Errorf("%w: items %d", errHeader, n)
	}
	plain := hdrFields + (itemFields+planFields)*n
	if n > int64(len(b)) || (int64(len(b)) != 8*plain && int64(len(b)) != 8*(plain+1)) {
		return header{}, fmt.Errorf("%w: %d bytes for %d items", errHeader, len(b), n)
	}
	if h.mode == modeUndo {
		h.newest, h.lease = h.lease == 1, 0
	}
	h.nk = int(nk)
	h.items = make([]headerItem, n)
	for i := range h.items {
		it := &h.items[i]
		key, global, policy := r.next("key"), r.next("global"), r.next("policy")
		it.hits, it.min = r.next("hits"), r.next("min")
		f := r.next("flags")
		if r.err != nil {
			return header{}, fmt.Errorf("item %d: %w", i+1, r.err)
		}
		switch {
		case key < 1 || key > nk:
			return header{}, fmt.Errorf("%w: item %d: key %d of %d", errHeader, i+1, key, nk)
		case global < 0 || global > nk:
			return header{}, fmt.Errorf("%w: item %d: global %d of %d", errHeader, i+1, global, nk)
		case policy < 1:
			return header{}, fmt.Errorf("%w: item %d: policy %d", errHeader, i+1, policy)
		case f < 0 || f > flagRefund|flagShadow|flagEntered:
			return header{}, fmt.Errorf("%w: item %d: flags %d", errHeader, i+1, f)
		}
		it.key, it.global, it.policy = int(key), int(global), int(policy)
		it.refund, it.shadow, it.entered = f&flagRefund != 0, f&flagShadow != 0, f&flagEntered != 0
	}
	for i := range h.items {
		it := &h.items[i]
		lead, glob := r.next("lead"), r.next("glob")
		if r.err != nil {
			return header{}, fmt.Errorf("item %d: %w", i+1, r.err)
		}
		if lead < 0 || lead > n || glob < 0 || glob > n {
			return header{}, fmt.Errorf("%w: item %d: plan %d, %d of %d items", errHeader, i+1, lead, glob, n)
		}
		it.lead, it.glob = int(lead), int(glob)
	}
	if len(r.b) > 0 {
		if h.off = r.next("off"); r.err != nil {
			return header{}, r.err
		}
		if h.off == 0 {
			return header{}, fmt.Errorf("%w: off 0 sent", errHeader)
		}
	}
	return h, nil
}

// headerReader reads a header's doubles; err is set at the first that is
// not an integer as appendF64 writes it (-0, a fraction, NaN, ±Inf).
type headerReader struct {
	b   []byte
	err error
}

func (r *headerReader) next(field string) int64 {
	if r.err != nil {
		return 0
	}
	u := binary.BigEndian.Uint64(r.b)
	r.b = r.b[8:]
	f := math.Float64frombits(u)
	x, ok := integral(f)
	if !ok || u == 1<<63 {
		r.err = fmt.Errorf("%w: %s %v", errHeader, field, f)
	}
	return x
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
	// postPaid: the policy's groups are debited whatever the answer
	// (store.Plan.PostPaid).
	postPaid bool
}

func encodePolicy(p *tiers.Policy, now time.Time) *encoded {
	v := p.AppendCompactAt(nil, now)
	e := &encoded{arg: string(appendCompact(nil, v)), undo: undoableTake(p), postPaid: p.Overdraft}
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

// A reply of the decide function (apply.lua's "Reply"): its status and
// instant, then per item its flags (reply*) and eight numbers.
const (
	replyHead, replyItem = 2, 9
	replyOK              = 1
	replyBurst           = 2
	replyHard            = 4
	replyGlobal          = 8
)

// decision reads the function's answer for an item of policy p and
// completes it with what follows from the policy.
func decision(p *tiers.Policy, r *reader) tiers.Decision {
	flags := r.num()
	d := tiers.Decision{
		Granted:         r.num(),
		OK:              flags&replyOK != 0,
		Burst:           flags&replyBurst != 0,
		LimitedByHard:   flags&replyHard != 0,
		LimitedByGlobal: flags&replyGlobal != 0,
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

// grant is what a reply says of an item's grant.
type grant struct {
	ok, burst bool
	granted   int64
}

// readGrants reads the reply res of a call of n items: its status, its
// instant and, when the status is done, each item's grant.
func readGrants(res string, n int) (status, now int64, g []grant, err error) {
	r := reader{b: res}
	status, now = r.num(), r.num()
	if r.err == nil && status == statusDone {
		g = make([]grant, n)
		for i := range g {
			f := r.num()
			g[i] = grant{ok: f&replyOK != 0, burst: f&replyBurst != 0, granted: r.num()}
			for range replyItem - 2 {
				r.num()
			}
		}
	}
	if r.err != nil || r.b != "" {
		return 0, 0, nil, errReply
	}
	return status, now, g, nil
}

// batchCall returns args and hdr (their memory reused) set to the FCALL of
// a batch function, fn (batchNameArg, or xbatchArg on a Cluster master),
// that makes the calls reqs[i] for i in idx (each an FCALL of the decide
// function as call.command makes it: its name, the number of keys, the
// keys, the arguments), in order; hdr is its ARGV[1] (apply.lua's fbatch
// and fxbatch), big-endian doubles: the number of calls (for fxbatch, then
// the number of their keys), then per call its numbers of keys and of
// arguments. fbatch declares the calls' keys as its own; fxbatch, whose
// calls' keys are in several slots of its node, declares none and takes
// them after ARGV[1]. The calls' arguments follow, one call's after
// another's.
func batchCall(args []any, hdr []byte, fn any, reqs []*request, idx []int) ([]any, []byte) {
	cross := fn == xbatchArg
	nk := 0
	for _, i := range idx {
		nk += reqs[i].args[2].(int)
	}
	hdr = appendF64(hdr[:0], int64(len(idx)))
	if cross {
		hdr = appendF64(hdr, int64(nk))
	}
	for _, i := range idx {
		a := reqs[i].args
		k := a[2].(int)
		hdr = appendF64(appendF64(hdr, int64(k)), int64(len(a)-3-k))
	}
	args = append(args[:0], fcallName, fn)
	if cross {
		args = append(args, 0, hdr)
	} else {
		args = append(args, nk)
	}
	for _, i := range idx {
		a := reqs[i].args
		args = append(args, a[3:3+a[2].(int)]...)
	}
	if !cross {
		args = append(args, hdr)
	}
	for _, i := range idx {
		a := reqs[i].args
		args = append(args, a[3+a[2].(int):]...)
	}
	return args, hdr
}
