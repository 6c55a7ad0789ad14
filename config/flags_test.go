package config

import (
	"flag"
	"io"
	"strings"
	"testing"
)

// TestOptionsBind: the load flags set their Options field; --calendar-units
// takes an IANA zone, off or nothing, and refuses an unknown zone and the
// machine's Local, naming what it wants.
func TestOptionsBind(t *testing.T) {
	for _, tc := range []struct {
		args []string
		zone string // "" for none
		err  string
	}{
		{nil, "", ""},
		{[]string{"--calendar-units", "Europe/Paris"}, "Europe/Paris", ""},
		{[]string{"--calendar-units", "UTC", "--calendar-units", "off"}, "", ""},
		{[]string{"--calendar-units", "Mars/Olympus"}, "", "unknown time zone \"Mars/Olympus\""},
		{[]string{"--calendar-units", "Local"}, "", "want an IANA name"},
	} {
		var o Options
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		o.Bind(fs)
		err := fs.Parse(tc.args)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "calendar-units") {
				t.Errorf("%v: %v, want an error naming the flag and %q", tc.args, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		got := ""
		if o.CalendarUnits != nil {
			got = o.CalendarUnits.String()
		}
		if got != tc.zone || fs.Lookup("calendar-units").Value.String() != tc.zone {
			t.Errorf("%v: zone %q (flag %q), want %q", tc.args, got, fs.Lookup("calendar-units").Value, tc.zone)
		}
	}
	var o Options
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	o.Bind(fs)
	if err := fs.Parse([]string{"--merge-domains", "--fixed-window", "--overdraft"}); err != nil {
		t.Fatal(err)
	}
	if !o.MergeDomains || !o.FixedWindowDefault || !o.OverdraftDefault {
		t.Errorf("options %+v, want merge, fixed window and overdraft set", o)
	}
}
