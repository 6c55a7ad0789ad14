package tiers

import "time"

// exactMax is the largest limit whose hits are kept as exact timestamps;
// above it a window is kept in at most bucketsPerWindow buckets. A
// per-second log with no limit to enforce, kept only for the counts it
// reports, has reportBuckets.
const (
	exactMax         = 64
	bucketsPerWindow = 64
	reportBuckets    = 8
)

// A post-paid debit keeps a log within debtBuckets live buckets (beyond
// them it joins the newest one, which moves to its instant: older hits are
// counted late, never early) and its count at most maxCount (hits beyond it
// are not recorded), so that a state in debt does not grow with the traffic
// it rejects and every count stays exact in a double.
const (
	debtBuckets       = 64
	maxCount    int64 = 1 << 52
)

// State is the state of one (resource, domain) pair under one Policy: the
// burst tiers and the domain's hits of the last second (KindTiers), the
// balance (KindTokenBucket) or the current window's count (KindFixedWindow).
// The zero value is a pair with no history. A State grows its slices once to
// its policy's size and reuses them afterwards. A State is not safe for
// concurrent use; a store serializes the decisions of one pair.
type State struct {
	tiers  []tierState
	second hitLog // the domain's hits of the last second (KindTiers)

	// KindTokenBucket: val is the deficit (capacity less balance) in 1/p
	// credits at time at, unit the p it is kept in (see doc.go).
	// KindFixedWindow, KindQuota: val is the count of the window starting
	// at at. Neither depends on the policy's limits: a state keeps its
	// meaning when they change (SPEC §3, counts belong to the rule).
	used bool
	at   int64
	val  int64
	unit int64

	// Pacing (reserve.go). KindTokenBucket: ahead is the latest instant a
	// reservation was made for, and room the units a give-back may still
	// restore while one made since nothing was outstanding is pending.
	// KindFixedWindow, KindQuota: ahead is the count reserved in the
	// window after at's. Both 0 when nothing was reserved.
	ahead int64
	room  int64

	// exact keeps every log as exact timestamps whatever the limit (tests
	// compare it with the bucketed representation).
	exact bool
}

// tierState is one tier: when it was last entered and its hits.
type tierState struct {
	in      bool // entered at least once
	entered int64
	hits    hitLog
}

// Global is the per-resource state shared by all its domains: the resource's
// hits of the last second, for the global limit. The zero value has no
// history. A Global is not safe for concurrent use; a store serializes the
// decisions that touch it together with the domain's State.
type Global struct {
	second hitLog
	exact  bool
}

// entry is a bucket of n hits granted at or after at and before at plus the
// log's width (width 1: n hits granted at exactly at).
type entry struct {
	at, n int64
}

// hitLog is a list of buckets with strictly increasing starts: e[h:]. The
// head index and the running sum make counting and pruning cost the number
// of expired buckets only; the slice is compacted when it is full.
type hitLog struct {
	e   []entry
	h   int
	sum int64 // hits in e[h:]
}

// count returns the hits counted in a window of w at t: those of the buckets
// starting after t-w.
func (l *hitLog) count(t, w int64) int64 {
	n := l.sum
	lim := t - w
	for i := l.h; i < len(l.e) && l.e[i].at <= lim; i++ {
		n -= l.e[i].n
	}
	return n
}

// oldest returns the start of the oldest bucket counted at t.
func (l *hitLog) oldest(t, w int64) (int64, bool) {
	lim := t - w
	for i := l.h; i < len(l.e); i++ {
		if l.e[i].at > lim {
			return l.e[i].at, true
		}
	}
	return 0, false
}

// prune drops the buckets no longer counted at t.
func (l *hitLog) prune(t, w int64) {
	lim := t - w
	for l.h < len(l.e) && l.e[l.h].at <= lim {
		l.sum -= l.e[l.h].n
		l.h++
	}
	if l.h == len(l.e) {
		l.reset()
	}
}

// reset empties the log, keeping its memory.
func (l *hitLog) reset() {
	l.e, l.h, l.sum = l.e[:0], 0, 0
}

// add records n hits at t in buckets of width b, after pruning for window w.
// A hit at or before the newest bucket's start joins that bucket (time that
// goes backwards is counted late, never early).
func (l *hitLog) add(t, w, b, n int64) {
	l.addAt(t, t, w, b, n)
}

// addAt is add for a hit granted now at the later instant t (a
// reservation, reserve.go): the log is pruned at now, so that what the
// present still counts stays counted.
func (l *hitLog) addAt(now, t, w, b, n int64) {
	if n <= 0 {
		return
	}
	l.prune(min(now, t), w)
	at := floorDiv(t, b) * b
	l.sum += n
	if k := len(l.e); k > l.h && l.e[k-1].at >= at {
		l.e[k-1].n += n
		return
	}
	if len(l.e) == cap(l.e) && l.h > 0 {
		k := copy(l.e, l.e[l.h:])
		l.e, l.h = l.e[:k], 0
	}
	l.e = append(l.e, entry{at, n})
}

// debit records n hits at t as add does, bounded as debtBuckets and maxCount
// say.
func (l *hitLog) debit(t, w, b, n int64) {
	l.prune(t, w)
	n = min(n, maxCount-l.sum)
	if n <= 0 {
		return
	}
	if k := len(l.e); k-l.h >= debtBuckets {
		last := &l.e[k-1]
		last.at = max(last.at, floorDiv(t, b)*b)
		last.n += n
		l.sum += n
		return
	}
	l.add(t, w, b, n)
}

// removeNewest removes up to n hits counted at t, newest first, and returns
// how many it removed.
func (l *hitLog) removeNewest(t, w, n int64) int64 {
	l.prune(t, w)
	var done int64
	for done < n && len(l.e) > l.h {
		k := len(l.e) - 1
		take := min(n-done, l.e[k].n)
		l.e[k].n -= take
		l.sum -= take
		done += take
		if l.e[k].n == 0 {
			l.e = l.e[:k]
		}
	}
	if l.h == len(l.e) {
		l.reset()
	}
	return done
}

// removeOldest removes up to n hits counted at t, oldest first, and returns
// how many it removed: the refund of a concurrency limit's slots whose
// take is not known.
func (l *hitLog) removeOldest(t, w, n int64) int64 {
	l.prune(t, w)
	var done int64
	for done < n && l.h < len(l.e) {
		take := min(n-done, l.e[l.h].n)
		l.e[l.h].n -= take
		l.sum -= take
		done += take
		if l.e[l.h].n == 0 {
			l.h++
		}
	}
	if l.h == len(l.e) {
		l.reset()
	}
	return done
}

// removeSlots removes up to n hits counted at t from one bucket, the first
// that starts at or after at's bucket (width b), and returns how many it
// removed: the refund of a concurrency limit's slots taken at at. The take
// went into that bucket or, time having gone backwards, into a later one;
// so the bucket emptied is never newer than the take's own. When at's
// bucket has left the window (the take's slots were freed by their time to
// live) nothing is removed.
func (l *hitLog) removeSlots(t, at, w, b, n int64) int64 {
	l.prune(t, w)
	from := floorDiv(at, b) * b
	if from <= t-w {
		return 0
	}
	for i := l.h; i < len(l.e); i++ {
		if l.e[i].at < from {
			continue
		}
		take := min(n, l.e[i].n)
		l.e[i].n -= take
		l.sum -= take
		if l.e[i].n == 0 {
			l.e = append(l.e[:i], l.e[i+1:]...)
		}
		if l.h == len(l.e) {
			l.reset()
		}
		return take
	}
	return 0
}

// removeAt removes up to n hits counted at now from the bucket that hits
// granted at t went into (the first starting at or after t's bucket: a hit
// joins a newer bucket when one exists), then from newer buckets, and
// returns how many it removed: the give-back of a reservation at t.
func (l *hitLog) removeAt(now, t, w, b, n int64) int64 {
	l.prune(now, w)
	at := floorDiv(t, b) * b
	var done int64
	for i := l.h; i < len(l.e) && done < n; i++ {
		if l.e[i].at < at {
			continue
		}
		take := min(n-done, l.e[i].n)
		l.e[i].n -= take
		l.sum -= take
		done += take
	}
	// Drop the emptied buckets, keeping the starts strictly increasing.
	k := l.h
	for i := l.h; i < len(l.e); i++ {
		if l.e[i].n > 0 {
			l.e[k] = l.e[i]
			k++
		}
	}
	l.e = l.e[:k]
	if l.h == len(l.e) {
		l.reset()
	}
	return done
}

// nextExpiry returns the earliest instant after t at which a bucket leaves a
// window of w.
func (l *hitLog) nextExpiry(t, w int64) (int64, bool) {
	for i := l.h; i < len(l.e); i++ {
		if x := l.e[i].at + w; x > t {
			return x, true
		}
	}
	return 0, false
}

// clearsAt returns the first instant, from t on, at which the log counts at
// most lim hits in a window of w with no hit added: t when it already does.
func (l *hitLog) clearsAt(t, w, lim int64) int64 {
	n := l.count(t, w)
	if n <= lim {
		return t
	}
	low := t - w
	for i := l.h; i < len(l.e); i++ {
		if l.e[i].at <= low {
			continue
		}
		n -= l.e[i].n
		if n <= lim {
			return l.e[i].at + w
		}
	}
	return inf // not reached: the buckets sum to the count
}

// last returns the newest bucket's start.
func (l *hitLog) last() (int64, bool) {
	if len(l.e) == l.h {
		return 0, false
	}
	return l.e[len(l.e)-1].at, true
}

// buckets returns the live buckets.
func (l *hitLog) buckets() []entry { return l.e[l.h:] }

// tierWidth is the bucket width of a tier's log: 1 µs (exact timestamps) for
// a limit up to exactMax, else ceil(window/64).
func tierWidth(limit, window int64, exact bool) int64 {
	if exact || limit <= exactMax {
		return 1
	}
	return max(1, ceilDiv(window, bucketsPerWindow))
}

// secondWidth is the bucket width of a per-second log for limit (0: none).
func secondWidth(limit int64, exact bool) int64 {
	switch {
	case exact || (limit >= 1 && limit <= exactMax):
		return 1
	case limit == 0:
		return second / reportBuckets
	}
	return second / bucketsPerWindow
}

// ForgetAt returns the instant from which forgetting g cannot change any
// decision (its newest hit has left the last second), or the zero Time when
// g holds no hit. A nil g returns the zero Time.
func (g *Global) ForgetAt() time.Time {
	if g == nil {
		return time.Time{}
	}
	at, ok := g.second.last()
	if !ok {
		return time.Time{}
	}
	return time.UnixMicro(at + second)
}
