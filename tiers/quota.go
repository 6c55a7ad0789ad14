package tiers

import (
	"strconv"
	"strings"
	"time"
)

// Period is the calendar period of a Quota.
type Period uint8

// Periods of a calendar quota.
const (
	PeriodMinute Period = iota + 1
	PeriodHour
	PeriodDay
	PeriodWeek // ISO weeks, from Monday
	PeriodMonth
	PeriodQuarter
	PeriodYear
)

var periodNames = [...]string{
	PeriodMinute:  "minute",
	PeriodHour:    "hour",
	PeriodDay:     "day",
	PeriodWeek:    "week",
	PeriodMonth:   "month",
	PeriodQuarter: "quarter",
	PeriodYear:    "year",
}

// String returns the period's name in configuration ("minute" ... "year"),
// or "Period(n)" for an unknown period.
func (p Period) String() string {
	if p == 0 || int(p) >= len(periodNames) {
		return "Period(" + strconv.Itoa(int(p)) + ")"
	}
	return periodNames[p]
}

// ParsePeriod returns the period named s, in any case; ok is false for any
// other name.
func ParsePeriod(s string) (p Period, ok bool) {
	for i := range periodNames {
		if i > 0 && strings.EqualFold(s, periodNames[i]) {
			return Period(i), true
		}
	}
	return 0, false
}

// CalendarPeriod returns the calendar period that unit u names when units
// are read as calendar units (a day, an ISO week, a month or a year of a
// zone's clock, as a Quota counts them): ok is false for a second, a
// minute and an hour, whose windows are the same either way, and for an
// unknown unit.
func (u Unit) CalendarPeriod() (p Period, ok bool) {
	switch u {
	case UnitDay:
		return PeriodDay, true
	case UnitWeek:
		return PeriodWeek, true
	case UnitMonth:
		return PeriodMonth, true
	case UnitYear:
		return PeriodYear, true
	}
	return 0, false
}

// months is the number of months of a period counted in months, else 0.
func (p Period) months() int {
	switch p {
	case PeriodMonth:
		return 1
	case PeriodQuarter:
		return 3
	case PeriodYear:
		return 12
	}
	return 0
}

// Quota grants at most Limit hits in each calendar period: the minutes,
// hours, days, ISO weeks, months, quarters or years of the wall clock in
// Location (nil: UTC), or, when Anchor is set, the periods that follow one
// another from Anchor (a billing instant) on that clock.
//
// Days, weeks, months, quarters and years start at the same wall-clock
// time (midnight, or the anchor's time of day) and so are 23 or 25 hours
// long across a daylight-saving change; a month-based period anchored on a
// day that a shorter month lacks starts on that month's last day (an anchor
// on the 31st renews on February 28th or 29th, then on March 31st). Minutes
// and hours are 60 s and 3600 s steps from the origin (the anchor, or
// midnight of 2001-01-01 on the zone's clock), which are the clock's minutes
// and hours in every zone whose offsets since then are whole hours apart. Periods before the anchor follow the same
// rule backwards. A Quota is immutable once in use and safe for concurrent
// reads; the zero value is not valid (Limit and Period are needed).
type Quota struct {
	Limit    int64
	Period   Period
	Location *time.Location
	Anchor   time.Time
}

func (q *Quota) loc() *time.Location {
	if q.Location == nil {
		return time.UTC
	}
	return q.Location
}

// origin is the instant periods are counted from: Anchor, or the start of
// 2001-01-01 (a Monday, the first day of a month, a quarter and a year) on
// the quota's clock.
func (q *Quota) origin() time.Time {
	if !q.Anchor.IsZero() {
		return q.Anchor.In(q.loc())
	}
	return time.Date(2001, 1, 1, 0, 0, 0, 0, q.loc())
}

// boundary returns the start of the n-th period after origin o (n may be
// negative), in µs.
func (q *Quota) boundary(o time.Time, n int64) int64 {
	switch q.Period {
	case PeriodMinute, PeriodHour:
		return o.UnixMicro() + n*q.stepMicros()
	case PeriodDay, PeriodWeek:
		days := n
		if q.Period == PeriodWeek {
			days *= 7
		}
		y, m, d := o.Date()
		h, mi, s := o.Clock()
		return time.Date(y, m, d+int(days), h, mi, s, o.Nanosecond(), o.Location()).UnixMicro()
	}
	y, m, d := o.Date()
	h, mi, s := o.Clock()
	// The month n periods on, then the anchor's day clamped to its length.
	first := time.Date(y, m+time.Month(n*int64(q.Period.months())), 1, 0, 0, 0, 0, time.UTC)
	fy, fm, _ := first.Date()
	last := time.Date(fy, fm+1, 0, 0, 0, 0, 0, time.UTC).Day()
	return time.Date(fy, fm, min(d, last), h, mi, s, o.Nanosecond(), o.Location()).UnixMicro()
}

func (q *Quota) stepMicros() int64 {
	if q.Period == PeriodMinute {
		return 60 * second
	}
	return 3600 * second
}

// index returns n such that boundary(n) <= t < boundary(n+1).
func (q *Quota) index(o time.Time, t int64) int64 {
	var n int64
	switch q.Period {
	case PeriodMinute, PeriodHour:
		return floorDiv(t-o.UnixMicro(), q.stepMicros())
	case PeriodDay, PeriodWeek:
		// Civil days between the two dates on the quota's clock.
		ct := time.UnixMicro(t).In(o.Location())
		ty, tm, td := ct.Date()
		oy, om, od := o.Date()
		days := (time.Date(ty, tm, td, 0, 0, 0, 0, time.UTC).Unix() - time.Date(oy, om, od, 0, 0, 0, 0, time.UTC).Unix()) / 86400
		n = days
		if q.Period == PeriodWeek {
			n = floorDiv(days, 7)
		}
	default:
		ct := time.UnixMicro(t).In(o.Location())
		ty, tm, _ := ct.Date()
		oy, om, _ := o.Date()
		n = floorDiv(int64(ty-oy)*12+int64(tm-om), int64(q.Period.months()))
	}
	for q.boundary(o, n) > t {
		n--
	}
	for q.boundary(o, n+1) <= t {
		n++
	}
	return n
}

// Bounds returns the period holding now: its start and its end (the next
// period's start). The zero Quota's periods are those of a minute.
func (q *Quota) Bounds(now time.Time) (start, end time.Time) {
	s, e := q.bounds(now.UnixMicro())
	return time.UnixMicro(s).In(q.loc()), time.UnixMicro(e).In(q.loc())
}

func (q *Quota) bounds(t int64) (start, end int64) {
	if q.Period == 0 || int(q.Period) >= len(periodNames) {
		c := *q
		c.Period = PeriodMinute
		return c.bounds(t)
	}
	o := q.origin()
	n := q.index(o, t)
	return q.boundary(o, n), q.boundary(o, n+1)
}

// QuotaTableLen is the number of boundaries AppendBounds writes.
const QuotaTableLen = 6

// AppendBounds appends to dst the QuotaTableLen boundaries (µs) of the
// periods around now: the starts of the two periods before now's, of now's
// and of the two after it, and the end of the last. A port of the procedure
// that reads another clock (the Redis function, on its master's time) takes
// the period holding its own now from this table, never computing a
// calendar itself; it stays exact while its clock is within two periods of
// now.
func (q *Quota) AppendBounds(dst []int64, now time.Time) []int64 {
	if q.Period == 0 || int(q.Period) >= len(periodNames) {
		c := *q
		c.Period = PeriodMinute
		return c.AppendBounds(dst, now)
	}
	o := q.origin()
	n := q.index(o, now.UnixMicro())
	for i := n - 2; i <= n+3; i++ {
		dst = append(dst, q.boundary(o, i))
	}
	return dst
}
