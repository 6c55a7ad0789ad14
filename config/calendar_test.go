package config

import (
	"strings"
	"testing"
	"time"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/tiers"
)

// TestCalendarUnits: with calendar units (--calendar-units, a file's
// calendar_units), a rate_limit's day, week, month and year are calendar
// periods of the zone (a quota of that period), in either algorithm; a
// second, a minute and an hour are not; a limit of 0 still bans; a file's
// key wins over the option, off turning it off.
func TestCalendarUnits(t *testing.T) {
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Fatal(err)
	}
	const body = `descriptors:
  - key: month
    rate_limit: {unit: month, requests_per_unit: 1000}
  - key: week
    rate_limit: {unit: week, requests_per_unit: 70, algorithm: fixed_window}
  - key: day
    rate_limit: {unit: day, requests_per_unit: 10}
    overrides: [{domain: vip, rate_limit: {unit: year, requests_per_unit: 5000}}]
  - key: hour
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: banned
    rate_limit: {unit: month, requests_per_unit: 0}
`
	policy := func(c *Config, key, value string) *tiers.Policy {
		t.Helper()
		m, ok := c.Tree.Match("api", []descriptors.Entry{{Key: key, Value: value}})
		if !ok {
			t.Fatalf("%s: no match", key)
		}
		return m.Policy
	}
	quota := func(p *tiers.Policy, limit int64, per tiers.Period, zone string) bool {
		return p.Kind == tiers.KindQuota && p.Quota.Limit == limit && p.Quota.Period == per && p.Quota.Location.String() == zone && p.Quota.Anchor.IsZero()
	}
	for _, tc := range []struct {
		name   string
		opts   Options
		header string
		zone   string // "": no calendar units
	}{
		{"the option", Options{CalendarUnits: paris}, "", "Europe/Paris"},
		{"the option, fixed windows by default", Options{CalendarUnits: paris, FixedWindowDefault: true}, "", "Europe/Paris"},
		{"the file's key", Options{}, "calendar_units: America/New_York\n", "America/New_York"},
		{"the file's key over the option", Options{CalendarUnits: paris}, "calendar_units: UTC\n", "UTC"},
		{"off", Options{CalendarUnits: paris}, "calendar_units: off\n", ""},
		{"none", Options{}, "", ""},
	} {
		c, _, err := load(t, tc.opts, "api.yaml", "domain: api\n"+tc.header+body)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		dc, _ := c.Tree.Domain("api")
		month, week, day, vip, hour, ban := policy(c, "month", "x"), policy(c, "week", "x"), policy(c, "day", "x"), policy(c, "day", "vip"), policy(c, "hour", "x"), policy(c, "banned", "x")
		if tc.zone == "" {
			if dc.CalendarUnits != nil || month.Kind != tiers.KindTiers || month.Tiers[0].Window != 30*24*time.Hour || week.Kind != tiers.KindFixedWindow {
				t.Errorf("%s: %v; month %+v, week %+v; want a month of 30 days, a fixed week", tc.name, dc.CalendarUnits, month, week)
			}
			continue
		}
		if dc.CalendarUnits == nil || dc.CalendarUnits.String() != tc.zone {
			t.Errorf("%s: the domain's calendar units %v, want %s", tc.name, dc.CalendarUnits, tc.zone)
		}
		if !quota(month, 1000, tiers.PeriodMonth, tc.zone) || !quota(week, 70, tiers.PeriodWeek, tc.zone) ||
			!quota(day, 10, tiers.PeriodDay, tc.zone) || !quota(vip, 5000, tiers.PeriodYear, tc.zone) {
			t.Errorf("%s: month %+v, week %+v, day %+v, vip %+v; want calendar periods of %s", tc.name, month, week, day, vip, tc.zone)
		}
		if (hour.Kind != tiers.KindTiers && !tc.opts.FixedWindowDefault) || (tc.opts.FixedWindowDefault && hour.Kind != tiers.KindFixedWindow) {
			t.Errorf("%s: hour %+v, want it unchanged", tc.name, hour)
		}
		if !banned(ban) {
			t.Errorf("%s: a month of 0 %+v, want a fixed window of 0 (every request rejected)", tc.name, ban)
		}
	}
}

func TestCalendarUnitsErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files []string
		want  string
	}{
		{"an unknown zone", []string{"api.yaml", "domain: api\ncalendar_units: Mars/Olympus\ndescriptors: []\n"},
			`api.yaml:2: calendar_units: unknown time zone "Mars/Olympus"`},
		{"not a string", []string{"api.yaml", "domain: api\ncalendar_units: [UTC]\ndescriptors: []\n"}, "api.yaml:2: calendar_units:"},
		{"merged files that disagree", []string{
			"a.yaml", "domain: api\ncalendar_units: UTC\ndescriptors: [{key: a, rate_limit: {unit: day, requests_per_unit: 1}}]\n",
			"b.yaml", "domain: api\ndescriptors: [{key: b, rate_limit: {unit: day, requests_per_unit: 1}}]\n"},
			"b.yaml:1: calendar_units: calendar units off, but UTC in a.yaml:1 of the same domain"},
	} {
		_, _, err := load(t, Options{MergeDomains: true}, tc.files...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}
