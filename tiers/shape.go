package tiers

import "encoding/binary"

// Shape returns a stable hash of p's shape: what a pair's state kept under p
// means, apart from p's numbers. Stores key a pair's state by its rule and
// its policy's shape (SPEC §3, counts belong to the rule), so that a policy
// of the same shape reads the state with its own numbers, and a policy of
// another shape starts from a fresh state.
//
// The shape is the kind and, by kind:
//   - KindTiers: the number of tiers, each tier's window, whether a
//     global limit is set (a resource's domains then share a global state,
//     which a store keeps beside them), and whether it is a concurrency
//     limit (its hits are slots, not requests: a rule that becomes one, or
//     stops being one, starts afresh);
//   - KindFixedWindow: the unit;
//   - KindQuota: the period, the time zone and the anchor;
//   - KindTokenBucket: nothing more.
//
// Everything else is a number applied to the counts already made: the
// limits of tiers, fixed windows and quotas, the hard and global limits'
// values, active periods, cooldowns and skippable, a bucket's capacity,
// refill and period, and post-paid counting (Overdraft). A state read under
// new numbers keeps its meaning: a tier's hits are the hits it counts
// whatever the limit (a log kept exact under a limit up to 64 and in
// buckets above reads as is, exact timestamps counting exactly and buckets
// in the lenient direction), a bucket keeps what it owes (converted to
// whole credits when its refill changes), a window and a quota their
// count.
//
// Shape is the 64-bit FNV-1a hash of AppendShape's bytes, never 0. It is
// safe for concurrent use.
func (p *Policy) Shape() uint64 {
	var buf [64 + 10*MaxTiers]byte
	id := uint64(14695981039346656037)
	for _, c := range p.AppendShape(buf[:0]) {
		id ^= uint64(c)
		id *= 1099511628211
	}
	if id == 0 {
		id = 1 // 0 means "not computed"
	}
	return id
}

// AppendShape appends the bytes Shape hashes to dst.
func (p *Policy) AppendShape(dst []byte) []byte {
	if p == nil {
		return append(dst, 0xff)
	}
	dst = append(dst, byte(p.Kind))
	switch p.Kind {
	case KindTiers:
		n := numTiers(p)
		g := byte(0)
		if p.GlobalLimit > 0 {
			g = 1
		}
		dst = append(dst, byte(n), g)
		for _, t := range p.Tiers[:n] {
			dst = binary.AppendVarint(dst, Micros(t.Window))
		}
		if p.Concurrency {
			// Only then: every other policy keeps the shape, and so the
			// keys, it had before concurrency limits existed.
			dst = append(dst, 'c')
		}
	case KindFixedWindow:
		dst = append(dst, byte(p.Window.Unit))
	case KindQuota:
		q := &p.Quota
		dst = append(dst, byte(q.Period))
		if q.Location != nil {
			dst = append(dst, q.Location.String()...)
		}
		dst = append(dst, 0)
		if !q.Anchor.IsZero() {
			dst = binary.AppendVarint(dst, q.Anchor.UnixMicro())
		}
	}
	return dst
}
