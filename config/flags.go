package config

import (
	"flag"
	"fmt"
	"strings"
	"time"
)

// Bind declares on fs the flags of the settings that change how a
// configuration loads, with o's values as defaults: charon serve and the
// verbs that load a configuration offline (config check, config diff,
// suggest, replay) declare them alike, so that all load alike.
func (o *Options) Bind(fs *flag.FlagSet) {
	fs.BoolVar(&o.MergeDomains, "merge-domains", o.MergeDomains, "merge files that share a domain instead of refusing them")
	fs.BoolVar(&o.FixedWindowDefault, "fixed-window", o.FixedWindowDefault, "rate_limit without an algorithm uses envoyproxy/ratelimit's calendar-aligned fixed window instead of the exact sliding window")
	fs.Var(zone{&o.CalendarUnits}, "calendar-units", "the units day, week, month and year of rate limits (files, xDS, a request's own limit) are calendar periods of this IANA time `zone`'s clock, a month from the 1st, in sliding and fixed-window modes alike (a file's calendar_units: ZONE or off wins); unset: envoyproxy/ratelimit's fixed lengths, a month of 30 days")
	fs.BoolVar(&o.OverdraftDefault, "overdraft", o.OverdraftDefault, "every limit counts post-paid usage unless its descriptor says overdraft: false: a refused request's hits are debited all the same, and a limit in debt refuses every request until its window repays it")
}

// zone is --calendar-units, Options.CalendarUnits as a flag: an IANA time
// zone's name, checked when set; "" or off for none.
type zone struct{ loc **time.Location }

func (z zone) String() string {
	if z.loc == nil || *z.loc == nil {
		return ""
	}
	return (*z.loc).String()
}

func (z zone) Set(s string) error {
	if s == "" || strings.EqualFold(s, "off") {
		*z.loc = nil
		return nil
	}
	loc, err := time.LoadLocation(s)
	if err != nil || s == "Local" {
		return fmt.Errorf("unknown time zone %q (want an IANA name such as Europe/Paris or UTC)", s)
	}
	*z.loc = loc
	return nil
}
