package engine

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/tiers"
)

// answer is what a status tells Envoy.
type answer struct {
	Code      Code
	Limit     CurrentLimit
	Remaining uint32
	Reset     time.Duration
}

func answers(r *Response) []answer {
	var as []answer
	for _, st := range r.Statuses {
		a := answer{Code: st.Code, Remaining: st.Remaining, Reset: st.ResetAfter}
		if st.Limit != nil {
			a.Limit = *st.Limit
		}
		as = append(as, a)
	}
	return as
}

// fixedEngine decides, at 40.3 s into a minute, against fixed windows as
// --fixed-window loads them (lyftAnswers: with its engine option too): n 2
// per minute, d 10 per day, b 100 per minute, z 0 per minute (a policy that
// keeps its unit), shadow 1 per minute in shadow mode, and slide a sliding
// window of 60 per minute.
func fixedEngine(t *testing.T, lyftAnswers bool) *Engine {
	t.Helper()
	fixed := func(n int64, u tiers.Unit) *tiers.Policy {
		return &tiers.Policy{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Limit: n, Unit: u}}
	}
	tree, err := descriptors.NewTree([]descriptors.DomainSpec{{Config: descriptors.DomainConfig{Name: "test"}, Nodes: []*descriptors.Node{
		{Key: "n", Limit: &descriptors.Limit{Policy: fixed(2, tiers.UnitMinute)}},
		{Key: "d", Limit: &descriptors.Limit{Policy: fixed(10, tiers.UnitDay)}},
		{Key: "b", Limit: &descriptors.Limit{Policy: fixed(100, tiers.UnitMinute)}},
		{Key: "z", Limit: &descriptors.Limit{Name: "ban", Policy: fixed(0, tiers.UnitMinute)}},
		{Key: "shadow", Limit: &descriptors.Limit{ShadowMode: true, Policy: fixed(1, tiers.UnitMinute)}},
		{Key: "slide", Limit: &descriptors.Limit{Policy: lyft(60, time.Minute)}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	st := memstore.New(memstore.Options{})
	t.Cleanup(func() { st.Close() })
	c := &clock{now: time.Date(2030, 1, 2, 3, 4, 40, 300e6, time.UTC)}
	e := New(Options{Store: st, Now: c.Now, FixedWindowOverrides: lyftAnswers})
	e.SetTree(tree)
	return e
}

func hits(n uint64, kv ...string) Descriptor {
	d := desc(kv...)
	d.Hits, d.HasHits = n, true
	return d
}

// TestFixedWindowAnswersLikeLyft: a fixed window answers
// envoyproxy/ratelimit's numbers: duration_until_reset in whole seconds
// (its CalculateReset: 60 − 40 = 20 s at 40.3 s into a minute, where the
// exact 19.7 s would read 19 in Envoy's X-RateLimit-Reset), limit_remaining 0
// whenever the window rejects, and a zero limit its unit. A sliding window
// keeps SPEC §2's remaining.
func TestFixedWindowAnswersLikeLyft(t *testing.T) {
	const minute, day = 20 * time.Second, 75320 * time.Second // the rests of the minute and the day
	perMinute := func(n uint32) CurrentLimit { return CurrentLimit{RequestsPerUnit: n, Unit: tiers.UnitMinute} }
	e := fixedEngine(t, true)
	steps := []struct {
		what string
		req  []Descriptor
		want []answer
	}{
		{"n's first hit", []Descriptor{desc("n", "x")}, []answer{{ok, perMinute(2), 1, minute}}},
		{"d filled", []Descriptor{hits(10, "d", "x")}, []answer{{ok, CurrentLimit{10, tiers.UnitDay, 0, ""}, 0, day}}},
		{"n within, d over", []Descriptor{desc("n", "x"), desc("d", "x")}, []answer{
			{ok, perMinute(2), 0, minute},
			{over, CurrentLimit{10, tiers.UnitDay, 0, ""}, 0, day},
		}},
		{"b: 50 hits", []Descriptor{hits(50, "b", "x")}, []answer{{ok, perMinute(100), 50, minute}}},
		// 50 remain but 60 are asked: over, and 0 remaining, as there.
		{"b: 60 more", []Descriptor{hits(60, "b", "x")}, []answer{{over, perMinute(100), 0, minute}}},
		// More hits than the limit: never granted, but the reset is the
		// window's, as there.
		{"b: 101 hits", []Descriptor{hits(101, "b", "y")}, []answer{{over, perMinute(100), 0, minute}}},
		{"z: a limit of 0", []Descriptor{desc("z", "x")}, []answer{{over, CurrentLimit{0, tiers.UnitMinute, 0, "ban"}, 0, minute}}},
		{"shadow over", []Descriptor{hits(2, "shadow", "x")}, []answer{{ok, perMinute(1), 0, minute}}},
		{"own limit of 0", []Descriptor{{Entries: entries("o", "x"), Override: &Override{Unit: tiers.UnitMinute}}}, []answer{{over, perMinute(0), 0, minute}}},
		// A sliding window keeps SPEC §2: 30 more hits would be granted.
		{"slide: 30 hits", []Descriptor{hits(30, "slide", "x")}, []answer{{ok, perMinute(60), 30, time.Minute}}},
		{"slide: 40 more", []Descriptor{hits(40, "slide", "x")}, []answer{{over, perMinute(60), 30, time.Minute}}},
	}
	for _, s := range steps {
		r := ask(t, e, &Request{Domain: "test", Descriptors: s.req})
		if d := cmp.Diff(s.want, answers(r)); d != "" {
			t.Errorf("%s (-want +got):\n%s", s.what, d)
		}
	}
}

// TestFixedWindowNeverWithoutLyftAnswers: without FixedWindowOverrides (no
// --fixed-window), a fixed window that can never grant the request keeps
// the reset that never comes (docs/architecture.md), but a limit of 0, the
// configuration's or a request's own (its unit and no name), answers as
// envoyproxy/ratelimit in every mode: the rest of its unit's window.
func TestFixedWindowNeverWithoutLyftAnswers(t *testing.T) {
	e := fixedEngine(t, false)
	for _, s := range []struct {
		what string
		req  Descriptor
		want answer
	}{
		{"b: 101 hits", hits(101, "b", "x"), answer{over, CurrentLimit{100, tiers.UnitMinute, 0, ""}, 0, tiers.Unbounded}},
		{"z: a limit of 0", desc("z", "x"), answer{over, CurrentLimit{0, tiers.UnitMinute, 0, "ban"}, 0, 20 * time.Second}},
		{"own limit of 0", Descriptor{Entries: entries("o", "x"), Override: &Override{Unit: tiers.UnitHour}}, answer{over, CurrentLimit{0, tiers.UnitHour, 0, ""}, 0, 55*time.Minute + 20*time.Second}},
		{"n's first hit", desc("n", "x"), answer{ok, CurrentLimit{2, tiers.UnitMinute, 0, ""}, 1, 20 * time.Second}},
	} {
		r := ask(t, e, &Request{Domain: "test", Descriptors: []Descriptor{s.req}})
		if d := cmp.Diff([]answer{s.want}, answers(r)); d != "" {
			t.Errorf("%s (-want +got):\n%s", s.what, d)
		}
	}
}

// TestWindowRest: envoyproxy/ratelimit's CalculateReset, unit − now % unit
// on whole Unix seconds: from 1 s to the unit's length.
func TestWindowRest(t *testing.T) {
	at := func(s int64, ns int64) time.Time { return time.Unix(s, ns) }
	for _, tt := range []struct {
		u    tiers.Unit
		now  time.Time
		want time.Duration
	}{
		{tiers.UnitMinute, at(1_900_000_020+40, 300e6), 20 * time.Second}, // 1_900_000_020 starts a minute
		{tiers.UnitSecond, at(5, 999e6), time.Second},
		{tiers.UnitMinute, at(60, 0), time.Minute},
		{tiers.UnitMinute, at(119, 999e6), time.Second},
		{tiers.UnitWeek, at(0, 1), 7 * 24 * time.Hour},
		{tiers.UnitMinute, at(-1, 500e6), time.Second}, // before 1970: floored
		{0, at(10, 0), 0},
	} {
		if got := windowRest(tt.u, tt.now); got != tt.want {
			t.Errorf("windowRest(%v, %v) = %v, want %v", tt.u, tt.now.UTC(), got, tt.want)
		}
	}
}
