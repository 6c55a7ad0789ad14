package tiers

import "errors"

// GlobalCompact is the first integer of a Global's compact form (a
// State's is its policy's Kind).
const GlobalCompact = 9

// ErrBadCompact is returned by SetCompact for a form that is not one
// AppendCompact writes.
var ErrBadCompact = errors.New("tiers: malformed compact state")

// AppendCompact appends s's compact form under p to dst: integers, as a port
// of the procedure (the Redis store's function) keeps a state. By p's kind:
//
//	KindTiers:       0, the per-second log, n, then for tiers 1..n
//	                 (n the highest tier ever entered): entered (0 or 1),
//	                 entry instant, log
//	KindTokenBucket: 1, used (0 or 1), instant, deficit, its unit, and
//	                 when a reservation left them non-zero (reserve.go):
//	                 the latest reserved instant and the room
//	KindFixedWindow,
//	KindQuota:       kind, used (0 or 1), instant, count, and when a
//	                 reservation left it non-zero the count reserved in
//	                 the next window and 0
//
// where a log is m, then m pairs (bucket start, hits). Instants are in µs.
// No form holds a limit of p: a state written under one policy reads under
// another of the same shape (Policy.Shape) with the same meaning.
func (s *State) AppendCompact(p *Policy, dst []int64) []int64 {
	dst = append(dst, int64(p.Kind))
	if p.Kind != KindTiers {
		used := int64(0)
		if s.used {
			used = 1
		}
		dst = append(dst, used, s.at, s.val)
		if p.Kind == KindTokenBucket {
			dst = append(dst, s.unit)
		}
		if s.ahead != 0 || s.room != 0 {
			dst = append(dst, s.ahead, s.room)
		}
		return dst
	}
	dst = s.second.appendCompact(dst)
	n := 0
	for i := range s.tiers {
		if s.tiers[i].in {
			n = i + 1
		}
	}
	dst = append(dst, int64(n))
	for _, ts := range s.tiers[:n] {
		in := int64(0)
		if ts.in {
			in = 1
		}
		dst = ts.hits.appendCompact(append(dst, in, ts.entered))
	}
	return dst
}

// SetCompact sets s to the state whose compact form under p is v. A form
// written for another kind reads as a fresh state, as it does for the
// Redis function; a malformed one returns ErrBadCompact and leaves s fresh.
func (s *State) SetCompact(p *Policy, v []int64) error {
	*s = State{}
	if len(v) == 0 || v[0] != int64(p.Kind) {
		return nil
	}
	if p.Kind != KindTiers {
		extra := 0 // the bucket's unit
		if p.Kind == KindTokenBucket {
			extra = 1
		}
		if len(v) != 4+extra && len(v) != 6+extra {
			return ErrBadCompact
		}
		s.used, s.at, s.val = v[1] == 1, v[2], v[3]
		if extra == 1 {
			s.unit = v[4]
		}
		if len(v) == 6+extra {
			s.ahead, s.room = v[4+extra], v[5+extra]
		}
		return nil
	}
	r := compactReader{v: v, i: 1}
	s.second = r.log()
	n := r.next()
	if n < 0 || n > MaxTiers {
		r.bad = true
	}
	for i := int64(0); i < n && !r.bad; i++ {
		in, at := r.next() == 1, r.next()
		s.tiers = append(s.tiers, tierState{in: in, entered: at, hits: r.log()})
	}
	if r.bad || r.i != len(v) {
		*s = State{}
		return ErrBadCompact
	}
	return nil
}

// AppendCompact appends g's compact form to dst: 9, then its log.
func (g *Global) AppendCompact(dst []int64) []int64 {
	return g.second.appendCompact(append(dst, GlobalCompact))
}

// SetCompact sets g from its compact form; anything but a Global's form
// reads as a fresh Global, and a malformed one returns ErrBadCompact.
func (g *Global) SetCompact(v []int64) error {
	*g = Global{}
	if len(v) == 0 || v[0] != GlobalCompact {
		return nil
	}
	r := compactReader{v: v, i: 1}
	g.second = r.log()
	if r.bad || r.i != len(v) {
		*g = Global{}
		return ErrBadCompact
	}
	return nil
}

func (l *hitLog) appendCompact(dst []int64) []int64 {
	b := l.buckets()
	dst = append(dst, int64(len(b)))
	for _, e := range b {
		dst = append(dst, e.at, e.n)
	}
	return dst
}

// compactReader reads a compact form; bad is set when it runs out.
type compactReader struct {
	v   []int64
	i   int
	bad bool
}

func (r *compactReader) next() int64 {
	if r.i >= len(r.v) {
		r.bad = true
		return 0
	}
	r.i++
	return r.v[r.i-1]
}

func (r *compactReader) log() hitLog {
	m := r.next()
	if m < 0 || m > int64(len(r.v)-r.i)/2 {
		r.bad = true
		return hitLog{}
	}
	var l hitLog
	for range m {
		at, n := r.next(), r.next()
		if n < 0 || (len(l.e) > 0 && at <= l.e[len(l.e)-1].at) {
			r.bad = true
			return hitLog{}
		}
		l.e = append(l.e, entry{at, n})
		l.sum += n
	}
	return l
}
