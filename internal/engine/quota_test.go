package engine

import (
	"context"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/tiers"
)

// TestQuotaMode: a quota descriptor over its limit answers OVER_LIMIT
// without making the request OVER_LIMIT, unless every quota descriptor of
// the request is over (envoyproxy/ratelimit's quota_mode); Options.QuotaMode
// does it for every limit.
func TestQuotaMode(t *testing.T) {
	perMinute := func(n int64) *tiers.Policy {
		return &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: n, Window: time.Minute, Active: tiers.Unbounded}}}
	}
	for _, all := range []bool{false, true} {
		st := memstore.New(memstore.Options{})
		defer st.Close()
		e := New(Options{Store: st, Now: newClock().Now, QuotaMode: all})
		tree, err := descriptors.NewTree([]descriptors.DomainSpec{{Config: descriptors.DomainConfig{Name: "q"}, Nodes: []*descriptors.Node{
			{Key: "a", Limit: &descriptors.Limit{QuotaMode: true, Policy: perMinute(1)}},
			{Key: "b", Limit: &descriptors.Limit{QuotaMode: true, Policy: perMinute(1)}},
			{Key: "c", Limit: &descriptors.Limit{QuotaMode: all, Policy: perMinute(5)}},
		}}})
		if err != nil {
			t.Fatal(err)
		}
		e.SetTree(tree)
		ask := func(keys ...string) (Code, []Code) {
			t.Helper()
			req := &Request{Domain: "q"}
			for _, k := range keys {
				req.Descriptors = append(req.Descriptors, desc(k, "x"))
			}
			resp, err := e.ShouldRateLimit(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			var codes []Code
			for _, s := range resp.Statuses {
				codes = append(codes, s.Code)
			}
			return resp.Code, codes
		}
		if code, _ := ask("a", "c"); code != CodeOK {
			t.Fatalf("all %v: first a, c: %v", all, code)
		}
		// a is over; b is within: the request is OK, a's status OVER_LIMIT.
		if code, codes := ask("a", "b", "c"); code != CodeOK || codes[0] != CodeOverLimit || codes[1] != CodeOK {
			t.Errorf("all %v: a over, b within: %v %v, want OK [OVER_LIMIT OK ...]", all, code, codes)
		}
		// Every quota descriptor is over: the request is.
		if code, _ := ask("a", "b"); code != CodeOverLimit {
			t.Errorf("all %v: a and b over: %v, want OVER_LIMIT", all, code)
		}
	}
}

// TestFixedWindowOverrideSharesTheCounter: with FixedWindowOverrides, a
// request's own limit is a fixed window and counts in the state of the
// configured fixed window of the same unit, as envoyproxy/ratelimit's
// counter is one for both; another unit, or without the option, has its own.
func TestFixedWindowOverrideSharesTheCounter(t *testing.T) {
	for _, fixed := range []bool{true, false} {
		st := memstore.New(memstore.Options{})
		defer st.Close()
		e := New(Options{Store: st, Now: newClock().Now, FixedWindowOverrides: fixed})
		tree, err := descriptors.NewTree([]descriptors.DomainSpec{{Config: descriptors.DomainConfig{Name: "d"}, Nodes: []*descriptors.Node{
			{Key: "user", Limit: &descriptors.Limit{Policy: &tiers.Policy{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Limit: 10, Unit: tiers.UnitMinute}}}},
		}}})
		if err != nil {
			t.Fatal(err)
		}
		e.SetTree(tree)
		ask := func(o *Override) Code {
			t.Helper()
			d := desc("user", "a")
			d.Override = o
			resp, err := e.ShouldRateLimit(context.Background(), &Request{Domain: "d", Descriptors: []Descriptor{d}})
			if err != nil {
				t.Fatal(err)
			}
			return resp.Code
		}
		two := &Override{RequestsPerUnit: 2, Unit: tiers.UnitMinute}
		ask(nil)
		ask(nil) // the configured window counts 2
		got := ask(two)
		if want := map[bool]Code{true: CodeOverLimit, false: CodeOK}[fixed]; got != want {
			t.Errorf("fixed %v: a 2-per-minute override after 2 configured hits: %v, want %v", fixed, got, want)
		}
		if got := ask(&Override{RequestsPerUnit: 2, Unit: tiers.UnitHour}); got != CodeOK {
			t.Errorf("fixed %v: an override of another unit: %v, want OK (its own counter)", fixed, got)
		}
	}
}

// TestQuotaModeCountsLikeLyft mirrors envoyproxy/ratelimit's
// shouldRateLimitWorker: a descriptor is a quota descriptor when global quota
// mode is on or its limit has quota_mode; under global quota mode that is
// every descriptor but an unlimited one, including one without a limit (no
// match, replaced, its own limit), which is within. The request is
// OVER_LIMIT when a descriptor that is not a quota descriptor is over, or
// when every quota descriptor is. Shadow mode answers a descriptor OK before
// quota mode sees it. An unlimited descriptor answers all of its remaining
// even when replaced. The store answers "over" for the value "over".
func TestQuotaModeCountsLikeLyft(t *testing.T) {
	perMinute := func(n int64) *tiers.Policy {
		return &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: n, Window: time.Minute, Active: tiers.Unbounded}}}
	}
	tree, err := descriptors.NewTree([]descriptors.DomainSpec{{Config: descriptors.DomainConfig{Name: "q"}, Nodes: []*descriptors.Node{
		{Key: "q1", Limit: &descriptors.Limit{QuotaMode: true, Policy: perMinute(1)}},
		{Key: "q2", Limit: &descriptors.Limit{QuotaMode: true, Policy: perMinute(1)}},
		{Key: "r", Limit: &descriptors.Limit{Policy: perMinute(1)}},
		{Key: "shadow", Limit: &descriptors.Limit{ShadowMode: true, Policy: perMinute(1)}},
		{Key: "shadowq", Limit: &descriptors.Limit{ShadowMode: true, QuotaMode: true, Policy: perMinute(1)}},
		{Key: "named", Limit: &descriptors.Limit{Name: "N", QuotaMode: true, Policy: perMinute(1)}},
		{Key: "replacer", Limit: &descriptors.Limit{Unlimited: true, Replaces: []string{"N"}}},
		{Key: "free", Limit: &descriptors.Limit{Name: "F", Unlimited: true, QuotaMode: true}},
		{Key: "freereplacer", Limit: &descriptors.Limit{Replaces: []string{"F"}, Policy: perMinute(1)}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	own := func(v string) Descriptor {
		d := desc("own", v)
		d.Override = &Override{RequestsPerUnit: 1, Unit: tiers.UnitMinute}
		return d
	}
	// Statuses: "OK", "OVER", "SHADOW" (OK, Shadow set), "MAX" (OK,
	// remaining 4294967295, not limited).
	tests := []struct {
		name  string
		descs []Descriptor
		// overall answers without and with global quota mode
		code, codeAll Code
		statuses      []string
	}{
		{"quota over alone", []Descriptor{desc("q1", "over")}, over, over, []string{"OVER"}},
		{"quota over + unmatched", []Descriptor{desc("q1", "over"), desc("nope", "x")}, over, ok, []string{"OVER", "OK"}},
		{"quota over + unmatched last of its path", []Descriptor{desc("q1", "over"), desc("q1", "x", "deeper", "y")}, over, ok, []string{"OVER", "OK"}},
		{"unmatched only", []Descriptor{desc("nope", "x"), desc("nope", "y")}, ok, ok, []string{"OK", "OK"}},
		{"quota over + quota over", []Descriptor{desc("q1", "over"), desc("q2", "over")}, over, over, []string{"OVER", "OVER"}},
		{"quota over + quota within", []Descriptor{desc("q1", "over"), desc("q2", "x")}, ok, ok, []string{"OVER", "OK"}},
		{"quota over + unlimited", []Descriptor{desc("q1", "over"), desc("free", "x")}, over, over, []string{"OVER", "MAX"}},
		{"quota over + replaced quota", []Descriptor{desc("q1", "over"), desc("named", "x"), desc("replacer", "x")}, over, ok, []string{"OVER", "OK", "MAX"}},
		{"replaced quota over + quota over", []Descriptor{desc("named", "over"), desc("replacer", "x"), desc("q1", "over")}, over, ok, []string{"OK", "MAX", "OVER"}},
		{"quota over + plain within", []Descriptor{desc("q1", "over"), desc("r", "x")}, over, ok, []string{"OVER", "OK"}},
		{"quota over + plain over", []Descriptor{desc("q1", "over"), desc("r", "over")}, over, over, []string{"OVER", "OVER"}},
		{"plain over + unmatched", []Descriptor{desc("r", "over"), desc("nope", "x")}, over, ok, []string{"OVER", "OK"}},
		{"plain over alone", []Descriptor{desc("r", "over")}, over, over, []string{"OVER"}},
		{"shadow quota over", []Descriptor{desc("shadowq", "over")}, ok, ok, []string{"SHADOW"}},
		{"shadow quota over + quota over", []Descriptor{desc("shadowq", "over"), desc("q1", "over")}, ok, ok, []string{"SHADOW", "OVER"}},
		{"shadow over + quota over", []Descriptor{desc("shadow", "over"), desc("q1", "over")}, over, ok, []string{"SHADOW", "OVER"}},
		{"own limit over + quota within", []Descriptor{own("over"), desc("q2", "x")}, over, ok, []string{"OVER", "OK"}},
		{"own limit over + unmatched", []Descriptor{own("over"), desc("nope", "x")}, over, ok, []string{"OVER", "OK"}},
		{"own limit over alone", []Descriptor{own("over")}, over, over, []string{"OVER"}},
		{"replaced unlimited answers all", []Descriptor{desc("free", "x"), desc("freereplacer", "x")}, ok, ok, []string{"MAX", "OK"}},
	}
	for _, all := range []bool{false, true} {
		fs := &fakeStore{answer: func(_ int, it store.Item) tiers.Decision {
			if it.Key.Domain == "over" || strings.HasSuffix(it.Key.Resource, "=over") {
				return tiers.Decision{}
			}
			return tiers.Decision{OK: true, Granted: it.Hits}
		}}
		e := New(Options{Store: fs, Now: newClock().Now, QuotaMode: all})
		e.SetTree(tree)
		for _, tt := range tests {
			resp, err := e.ShouldRateLimit(context.Background(), &Request{Domain: "q", Descriptors: tt.descs})
			if err != nil {
				t.Fatal(err)
			}
			want := map[bool]Code{false: tt.code, true: tt.codeAll}[all]
			var got []string
			for _, st := range resp.Statuses {
				s := map[Code]string{CodeOK: "OK", CodeOverLimit: "OVER"}[st.Code]
				switch {
				case st.Code == CodeOK && st.Shadow:
					s = "SHADOW"
				case st.Code == CodeOK && st.Remaining == math.MaxUint32 && st.Limit == nil:
					s = "MAX"
				}
				got = append(got, s)
			}
			if resp.Code != want || !slices.Equal(got, tt.statuses) {
				t.Errorf("global quota %v, %s: got %v %v, want %v %v", all, tt.name, resp.Code, got, want, tt.statuses)
			}
		}
	}
}

// TestExplainQuotaLikeDecide: Explain reports the modes Decide uses: under
// global quota mode a descriptor's own limit is a quota descriptor, and an
// unlimited descriptor named in another's replaces stays unlimited.
func TestExplainQuotaLikeDecide(t *testing.T) {
	tree, err := descriptors.NewTree([]descriptors.DomainSpec{{Config: descriptors.DomainConfig{Name: "q"}, Nodes: []*descriptors.Node{
		{Key: "free", Limit: &descriptors.Limit{Name: "F", Unlimited: true}},
		{Key: "r", Limit: &descriptors.Limit{Replaces: []string{"F"}, Policy: lyft(1, time.Minute)}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	st := memstore.New(memstore.Options{})
	t.Cleanup(func() { st.Close() })
	for _, all := range []bool{false, true} {
		e := New(Options{Store: st, Now: newClock().Now, QuotaMode: all})
		e.SetTree(tree)
		xs := explain(t, e, &Request{Domain: "q", Descriptors: []Descriptor{
			desc("free", "x"), desc("r", "x"),
			{Entries: entries("own", "x"), Override: &Override{RequestsPerUnit: 1, Unit: tiers.UnitMinute}},
		}})
		if xs[0].Reason != ReasonUnlimited {
			t.Errorf("global quota %v: replaced unlimited: reason %q, want %q", all, xs[0].Reason, ReasonUnlimited)
		}
		if !xs[2].Limited || xs[2].Quota != all || xs[2].Shadow {
			t.Errorf("global quota %v: own limit: Limited %v, Quota %v, Shadow %v; want true, %v, false", all, xs[2].Limited, xs[2].Quota, xs[2].Shadow, all)
		}
	}
}

// TestQuotaStatusIsMarked: a quota descriptor's status says so (the
// RateLimit headers never come from its OVER_LIMIT alone); with
// Options.QuotaMode every limited descriptor's does, its own limit's too.
func TestQuotaStatusIsMarked(t *testing.T) {
	perMinute := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 1, Window: time.Minute, Active: tiers.Unbounded}}}
	tree, err := descriptors.NewTree([]descriptors.DomainSpec{{Config: descriptors.DomainConfig{Name: "q"}, Nodes: []*descriptors.Node{
		{Key: "quota", Limit: &descriptors.Limit{QuotaMode: true, Policy: perMinute}},
		{Key: "plain", Limit: &descriptors.Limit{Policy: perMinute}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, all := range []bool{false, true} {
		st := memstore.New(memstore.Options{})
		defer st.Close()
		e := New(Options{Store: st, Now: newClock().Now, QuotaMode: all})
		e.SetTree(tree)
		own := desc("own", "x")
		own.Override = &Override{RequestsPerUnit: 1, Unit: tiers.UnitMinute}
		resp, err := e.ShouldRateLimit(context.Background(), &Request{Domain: "q", Descriptors: []Descriptor{desc("quota", "x"), desc("plain", "x"), own, desc("none", "x")}})
		if err != nil {
			t.Fatal(err)
		}
		var got []bool
		for _, s := range resp.Statuses {
			got = append(got, s.Quota)
		}
		if want := []bool{true, all, all, false}; !slices.Equal(got, want) {
			t.Errorf("all %v: Quota %v, want %v", all, got, want)
		}
	}
}

// TestCalendarQuota: a descriptor with a rate limit and a daily quota in
// New York grants only what both allow, all or nothing, answers which of
// the two decided, and renews the quota at New York's midnight.
func TestCalendarQuota(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	st := memstore.New(memstore.Options{})
	defer st.Close()
	now := time.Date(2025, 3, 8, 23, 0, 0, 0, ny)
	e := New(Options{Store: st, Now: func() time.Time { return now }})
	quota := &tiers.Policy{Kind: tiers.KindQuota, Quota: tiers.Quota{Limit: 3, Period: tiers.PeriodDay, Location: ny}}
	rate := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 2, Window: time.Minute, Active: tiers.Unbounded}}}
	tree, err := descriptors.NewTree([]descriptors.DomainSpec{{Config: descriptors.DomainConfig{Name: "plan"}, Nodes: []*descriptors.Node{
		{Key: "both", Limit: &descriptors.Limit{Policy: rate, Quota: quota}},
		{Key: "only", Limit: &descriptors.Limit{Quota: quota}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	e.SetTree(tree)
	ask := func(key string) Status {
		t.Helper()
		resp, err := e.ShouldRateLimit(context.Background(), &Request{Domain: "plan", Descriptors: []Descriptor{desc(key, "alice")}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Statuses[0]
	}
	midnight := time.Date(2025, 3, 9, 0, 0, 0, 0, ny)
	type answer struct {
		Code      Code
		By        LimitKind
		Remaining uint32
		Reset     time.Duration
	}
	steps := []struct {
		key     string
		advance time.Duration
		want    answer
	}{
		{"both", 0, answer{CodeOK, ByRate, 1, time.Minute}},                     // rate 1 left, quota 2 left
		{"both", 0, answer{CodeOK, ByRate, 0, time.Minute}},                     // rate 0, quota 1
		{"both", 0, answer{CodeOverLimit, ByRate, 0, time.Minute}},              // the rate rejects: the quota keeps 1
		{"both", 2 * time.Minute, answer{CodeOK, ByQuota, 0, 58 * time.Minute}}, // the quota's last one
		{"both", 0, answer{CodeOverLimit, ByQuota, 0, 58 * time.Minute}},        // the quota rejects until midnight
		{"only", 0, answer{CodeOK, ByQuota, 2, 58 * time.Minute}},               // another key, its own count
		{"both", 58 * time.Minute, answer{CodeOK, ByRate, 1, time.Minute}},      // a new day: the quota has 2 left
	}
	for i, s := range steps {
		now = now.Add(s.advance)
		st := ask(s.key)
		got := answer{st.Code, st.By, st.Remaining, st.ResetAfter}
		if got != s.want {
			t.Fatalf("step %d (%s at %v): got %+v, want %+v", i, s.key, now, got, s.want)
		}
		wantEnd := midnight
		if !now.Before(midnight) {
			wantEnd = midnight.Add(23 * time.Hour) // the day of the change to DST
		}
		if !st.PeriodEnd.Equal(wantEnd) || st.QuotaDecision.Remaining != max(0, int64(s.want.Remaining)) && s.want.By == ByQuota {
			t.Errorf("step %d: period end %v, want %v", i, st.PeriodEnd, wantEnd)
		}
	}
	xs, err := e.Explain(context.Background(), &Request{Domain: "plan", Descriptors: []Descriptor{desc("both", "alice")}})
	if err != nil {
		t.Fatal(err)
	}
	q := xs[0].CalendarQuota
	if q == nil || q.View.Used != 1 || !strings.Contains(q.Summary, "quota: 1 of 3 used in this day") {
		t.Fatalf("explain: %+v", q)
	}
}

// TestCalendarQuotaBulk: charon.v1's Request honours a descriptor's
// calendar quota: alone, with partial grants as the rate policy has them;
// beside a rate policy, whole or not at all, refused once the quota is
// spent.
func TestCalendarQuotaBulk(t *testing.T) {
	st := memstore.New(memstore.Options{})
	defer st.Close()
	now := time.Date(2025, 3, 8, 12, 0, 0, 0, time.UTC)
	e := New(Options{Store: st, Now: func() time.Time { return now }})
	quota := &tiers.Policy{Kind: tiers.KindQuota, Quota: tiers.Quota{Limit: 5, Period: tiers.PeriodDay, Location: time.UTC}}
	rate := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 100, Window: time.Minute, Active: tiers.Unbounded}}}
	tree, err := descriptors.NewTree([]descriptors.DomainSpec{{Config: descriptors.DomainConfig{Name: "plan"}, Nodes: []*descriptors.Node{
		{Key: "both", Limit: &descriptors.Limit{Policy: rate, Quota: quota}},
		{Key: "only", Limit: &descriptors.Limit{Quota: quota}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	e.SetTree(tree)
	req := func(key string, copies, min int64) Result {
		t.Helper()
		r, err := e.Request(context.Background(), "plan", []descriptors.Entry{{Key: key, Value: "alice"}}, copies, min)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	for i, s := range []struct {
		key             string
		copies, min     int64
		ok              bool
		granted, remain int64
	}{
		{"only", 3, 1, true, 3, 2},
		{"only", 4, 1, true, 2, 0}, // partial: what the quota has left
		{"only", 1, 1, false, 0, 0},
		{"both", 4, 1, true, 4, 1},  // whole: 4 of the quota's 5, the smaller remaining
		{"both", 2, 1, false, 0, 1}, // 2 do not fit whole: refused, nothing counted
		{"both", 1, 1, true, 1, 0},
	} {
		r := req(s.key, s.copies, s.min)
		if r.Decision.OK != s.ok || r.Decision.Granted != s.granted || r.Decision.Remaining != s.remain {
			t.Errorf("step %d (%s, %d copies, min %d): OK %v granted %d remaining %d, want %v %d %d", i, s.key, s.copies, s.min,
				r.Decision.OK, r.Decision.Granted, r.Decision.Remaining, s.ok, s.granted, s.remain)
		}
	}
}
