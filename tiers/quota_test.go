package tiers

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func mustLoc(t *testing.T, name string) *time.Location {
	t.Helper()
	l, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestQuotaBounds(t *testing.T) {
	ny := mustLoc(t, "America/New_York")
	berlin := mustLoc(t, "Europe/Berlin")
	kolkata := mustLoc(t, "Asia/Kolkata")
	at := func(loc *time.Location, s string) time.Time {
		t.Helper()
		v, err := time.ParseInLocation("2006-01-02 15:04:05", s, loc)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	anchor31 := at(time.UTC, "2024-01-31 09:30:00")
	tests := []struct {
		name       string
		q          Quota
		now        time.Time
		start, end time.Time
		hours      float64 // the period's length in hours, 0: not checked
	}{
		{"utc day", Quota{Period: PeriodDay}, at(time.UTC, "2025-03-09 17:00:00"), at(time.UTC, "2025-03-09 00:00:00"), at(time.UTC, "2025-03-10 00:00:00"), 24},
		{"new york spring forward day is 23h", Quota{Period: PeriodDay, Location: ny}, at(ny, "2025-03-09 12:00:00"), at(ny, "2025-03-09 00:00:00"), at(ny, "2025-03-10 00:00:00"), 23},
		{"new york fall back day is 25h", Quota{Period: PeriodDay, Location: ny}, at(ny, "2025-11-02 23:59:59"), at(ny, "2025-11-02 00:00:00"), at(ny, "2025-11-03 00:00:00"), 25},
		{"berlin midnight", Quota{Period: PeriodDay, Location: berlin}, at(berlin, "2025-06-30 23:59:59"), at(berlin, "2025-06-30 00:00:00"), at(berlin, "2025-07-01 00:00:00"), 24},
		{"kolkata hour on the half hour UTC", Quota{Period: PeriodHour, Location: kolkata}, at(kolkata, "2025-01-01 10:15:00"), at(kolkata, "2025-01-01 10:00:00"), at(kolkata, "2025-01-01 11:00:00"), 1},
		{"new york hour after fall back", Quota{Period: PeriodHour, Location: ny}, at(ny, "2025-11-02 03:10:00"), at(ny, "2025-11-02 03:00:00"), at(ny, "2025-11-02 04:00:00"), 1},
		{"iso week from Monday", Quota{Period: PeriodWeek}, at(time.UTC, "2025-01-05 23:00:00"), at(time.UTC, "2024-12-30 00:00:00"), at(time.UTC, "2025-01-06 00:00:00"), 168},
		{"leap february", Quota{Period: PeriodMonth}, at(time.UTC, "2024-02-29 23:59:59"), at(time.UTC, "2024-02-01 00:00:00"), at(time.UTC, "2024-03-01 00:00:00"), 29 * 24},
		{"quarter", Quota{Period: PeriodQuarter, Location: ny}, at(ny, "2025-05-15 00:00:00"), at(ny, "2025-04-01 00:00:00"), at(ny, "2025-07-01 00:00:00"), 0},
		{"leap year", Quota{Period: PeriodYear}, at(time.UTC, "2024-12-31 12:00:00"), at(time.UTC, "2024-01-01 00:00:00"), at(time.UTC, "2025-01-01 00:00:00"), 366 * 24},
		{"anchor on the 31st clamps in february", Quota{Period: PeriodMonth, Anchor: anchor31}, at(time.UTC, "2024-03-10 00:00:00"), at(time.UTC, "2024-02-29 09:30:00"), at(time.UTC, "2024-03-31 09:30:00"), 0},
		{"anchor on the 31st back to the 31st", Quota{Period: PeriodMonth, Anchor: anchor31}, at(time.UTC, "2024-04-01 00:00:00"), at(time.UTC, "2024-03-31 09:30:00"), at(time.UTC, "2024-04-30 09:30:00"), 0},
		{"anchor february 29 yearly", Quota{Period: PeriodYear, Anchor: at(time.UTC, "2024-02-29 00:00:00")}, at(time.UTC, "2025-03-01 00:00:00"), at(time.UTC, "2025-02-28 00:00:00"), at(time.UTC, "2026-02-28 00:00:00"), 0},
		{"before the anchor", Quota{Period: PeriodDay, Anchor: at(time.UTC, "2025-01-10 06:00:00")}, at(time.UTC, "2025-01-09 05:00:00"), at(time.UTC, "2025-01-08 06:00:00"), at(time.UTC, "2025-01-09 06:00:00"), 24},
		{"anchored day in new york keeps the clock", Quota{Period: PeriodDay, Location: ny, Anchor: at(ny, "2025-03-01 08:00:00")}, at(ny, "2025-03-09 09:00:00"), at(ny, "2025-03-09 08:00:00"), at(ny, "2025-03-10 08:00:00"), 24},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, e := tt.q.Bounds(tt.now)
			if !s.Equal(tt.start) || !e.Equal(tt.end) {
				t.Fatalf("Bounds(%v) = [%v, %v), want [%v, %v)", tt.now, s, e, tt.start, tt.end)
			}
			if tt.hours != 0 && e.Sub(s).Hours() != tt.hours {
				t.Errorf("period of %v h, want %v h", e.Sub(s).Hours(), tt.hours)
			}
		})
	}
}

// TestQuotaBoundsInvariants: over random instants of years, zones and
// periods, now's period holds now, periods tile time (the end of one is
// the start of the next), and the table a port reads agrees with Bounds.
func TestQuotaBoundsInvariants(t *testing.T) {
	zones := []string{"UTC", "America/New_York", "Europe/London", "Australia/Lord_Howe", "Asia/Kolkata", "America/Santiago", "Pacific/Apia", "America/St_Johns"}
	r := rand.New(rand.NewPCG(1, 2))
	base := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	span := int64(10*365*24*time.Hour) / 1000
	for i := range 20000 {
		q := Quota{Limit: 1, Period: Period(1 + r.IntN(7)), Location: mustLoc(t, zones[r.IntN(len(zones))])}
		if r.IntN(3) == 0 {
			q.Anchor = time.UnixMicro(base + r.Int64N(span))
		}
		now := time.UnixMicro(base + r.Int64N(span))
		s, e := q.Bounds(now)
		if now.Before(s) || !now.Before(e) {
			t.Fatalf("%d: %+v: Bounds(%v) = [%v, %v) does not hold it", i, q, now, s, e)
		}
		if s2, _ := q.Bounds(e); !s2.Equal(e) {
			t.Fatalf("%d: %+v: the period after [%v, %v) starts at %v", i, q, s, e, s2)
		}
		if _, e0 := q.Bounds(s.Add(-time.Microsecond)); !e0.Equal(s) {
			t.Fatalf("%d: %+v: the period before [%v, %v) ends at %v", i, q, s, e, e0)
		}
		b := q.AppendBounds(nil, now)
		want := []int64{}
		x := s.UnixMicro()
		for range 2 {
			ps, _ := q.Bounds(time.UnixMicro(x - 1))
			x = ps.UnixMicro()
		}
		for range QuotaTableLen {
			want = append(want, x)
			_, pe := q.Bounds(time.UnixMicro(x))
			x = pe.UnixMicro()
		}
		if diff := cmp.Diff(want, b); diff != "" {
			t.Fatalf("%d: %+v at %v: table (-want +got):\n%s", i, q, now, diff)
		}
	}
}

// TestQuotaDecide: a daily quota grants its limit once a day, rejects with
// the time to the next midnight of its zone, and starts afresh then.
func TestQuotaDecide(t *testing.T) {
	ny := mustLoc(t, "America/New_York")
	p := &Policy{Kind: KindQuota, Quota: Quota{Limit: 3, Period: PeriodDay, Location: ny}}
	if err := Validate(p); err != nil {
		t.Fatal(err)
	}
	var s State
	now := time.Date(2025, 3, 8, 22, 0, 0, 0, ny)
	midnight := time.Date(2025, 3, 9, 0, 0, 0, 0, ny)
	for i := range 3 {
		d := Request(p, &s, nil, now, 1, 1)
		if !d.OK || d.Remaining != int64(2-i) || d.ResetAfter != midnight.Sub(now) {
			t.Fatalf("request %d: got %+v, want granted, remaining %d, reset %v", i, d, 2-i, midnight.Sub(now))
		}
	}
	d := Request(p, &s, nil, now, 1, 1)
	if d.OK || d.RetryAfter != 2*time.Hour {
		t.Fatalf("4th: got %+v, want rejected for 2h", d)
	}
	if got := ForgetAt(p, &s); !got.Equal(midnight) {
		t.Errorf("ForgetAt = %v, want %v", got, midnight)
	}
	// The next day is 23 hours long (spring forward).
	d = Request(p, &s, nil, midnight, 1, 1)
	next := time.Date(2025, 3, 10, 0, 0, 0, 0, ny)
	if !d.OK || d.Remaining != 2 || d.ResetAfter != 23*time.Hour || !next.Equal(midnight.Add(23*time.Hour)) {
		t.Fatalf("at midnight: got %+v, want granted, remaining 2, reset 23h", d)
	}
}
