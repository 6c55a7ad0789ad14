package engine

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/tiers"
)

var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

func lyft(n int64, w time.Duration) *tiers.Policy {
	return &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: n, Window: w, Active: tiers.Unbounded}}}
}

// testTree is the configuration most tests run against.
func testTree(t *testing.T) *descriptors.Tree {
	t.Helper()
	nodes := []*descriptors.Node{
		{Key: "user", Limit: &descriptors.Limit{Name: "per_user", Policy: lyft(3, time.Second)}},
		{Key: "other", Limit: &descriptors.Limit{Policy: lyft(3, time.Second)}},
		{Key: "api", Value: "fixed", Limit: &descriptors.Limit{Name: "api", Policy: lyft(2, time.Minute)}},
		{Key: "two_s", Limit: &descriptors.Limit{Name: "two", Policy: lyft(5, 2*time.Second)}},
		{Key: "shadow", Limit: &descriptors.Limit{ShadowMode: true, Policy: lyft(1, time.Second)}},
		{Key: "free", Limit: &descriptors.Limit{Unlimited: true}},
		{Key: "copies", Limit: &descriptors.Limit{Copies: &descriptors.Copies{DomainLimit: 2}}},
		{Key: "tiered", Limit: &descriptors.Limit{Policy: &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{
			{Limit: 2, Window: time.Second, Active: tiers.Unbounded},
			{Limit: 4, Window: 2 * time.Second, Active: 10 * time.Second},
		}}}},
		{Key: "a", Limit: &descriptors.Limit{Name: "A", Policy: lyft(5, time.Second)}},
		{Key: "b", Limit: &descriptors.Limit{Name: "B", Replaces: []string{"A"}, Policy: lyft(10, time.Second)}},
		{Key: "path", Value: "/x", Children: []*descriptors.Node{{Key: "method", Value: "GET"}}},
	}
	tree, err := descriptors.NewTree([]descriptors.DomainSpec{
		{Config: descriptors.DomainConfig{Name: "test"}, Nodes: nodes},
		{Config: descriptors.DomainConfig{Name: "kill", IgnoreLimits: true}, Nodes: []*descriptors.Node{
			{Key: "user", Limit: &descriptors.Limit{Policy: lyft(1, time.Second)}},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return tree
}

// clock is an injected clock.
type clock struct{ now time.Time }

func (c *clock) Now() time.Time          { return c.now }
func (c *clock) Advance(d time.Duration) { c.now = c.now.Add(d) }
func newClock() *clock                   { return &clock{now: t0} }
func entries(kv ...string) []descriptors.Entry {
	var es []descriptors.Entry
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, descriptors.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return es
}

func desc(kv ...string) Descriptor { return Descriptor{Entries: entries(kv...)} }

// fakeStore records the items it is asked about and answers from answer.
type fakeStore struct {
	calls  int
	items  []store.Item
	answer func(i int, it store.Item) tiers.Decision
	err    error
}

func (f *fakeStore) Decide(_ context.Context, _ time.Time, items []store.Item, out []tiers.Decision) error {
	f.calls++
	f.items = append([]store.Item(nil), items...)
	if f.err != nil {
		return f.err
	}
	for i, it := range items {
		if f.answer != nil {
			out[i] = f.answer(i, it)
		} else {
			out[i] = tiers.Decision{OK: true, Granted: it.Hits}
		}
	}
	return nil
}

func (f *fakeStore) Close() error { return nil }

func newEngine(t *testing.T, st store.Store, c *clock) *Engine {
	t.Helper()
	e := New(Options{Store: st, Now: c.Now})
	e.SetTree(testTree(t))
	return e
}

func TestValidation(t *testing.T) {
	long := strings.Repeat("x", descriptors.MaxLen+1)
	many := make([]Descriptor, DefaultMaxDescriptors+1)
	for i := range many {
		many[i] = desc("user", "u")
	}
	tooManyEntries := Descriptor{}
	for range descriptors.MaxEntries + 1 {
		tooManyEntries.Entries = append(tooManyEntries.Entries, descriptors.Entry{Key: "k", Value: "v"})
	}
	tests := []struct {
		name      string
		req       *Request
		wantField string
	}{
		{"nil request", nil, "request"},
		{"empty domain", &Request{Descriptors: []Descriptor{desc("user", "u")}}, "domain"},
		{"long domain", &Request{Domain: long, Descriptors: []Descriptor{desc("user", "u")}}, "domain"},
		{"no descriptors", &Request{Domain: "test"}, "descriptors"},
		{"too many descriptors", &Request{Domain: "test", Descriptors: many}, "descriptors"},
		{"no entries", &Request{Domain: "test", Descriptors: []Descriptor{desc("user", "u"), {}}}, "descriptors[1].entries"},
		{"too many entries", &Request{Domain: "test", Descriptors: []Descriptor{tooManyEntries}}, "descriptors[0].entries"},
		{"empty key", &Request{Domain: "test", Descriptors: []Descriptor{desc("user", "u", "", "v")}}, "descriptors[0].entries[1].key"},
		{"long key", &Request{Domain: "test", Descriptors: []Descriptor{desc("user", "u"), desc(long, "v")}}, "descriptors[1].entries[0].key"},
		{"override unit", &Request{Domain: "test", Descriptors: []Descriptor{{Entries: entries("user", "u"), Override: &Override{RequestsPerUnit: 1}}}}, "descriptors[0].limit.unit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := &fakeStore{}
			e := newEngine(t, fs, newClock())
			resp, err := e.ShouldRateLimit(context.Background(), tt.req)
			var in *descriptors.InputError
			if !errors.As(err, &in) {
				t.Fatalf("err = %v (response %+v), want a *descriptors.InputError", err, resp)
			}
			if in.Field != tt.wantField {
				t.Errorf("Field = %q, want %q (message %q)", in.Field, tt.wantField, in.Message)
			}
			if fs.calls != 0 {
				t.Errorf("the store was called %d times for bad input", fs.calls)
			}
		})
	}
	t.Run("max hits option", func(t *testing.T) {
		e := New(Options{Store: &fakeStore{}, MaxHits: 10})
		_, err := e.ShouldRateLimit(context.Background(), &Request{Domain: "test", Hits: 11, Descriptors: []Descriptor{desc("user", "u")}})
		var in *descriptors.InputError
		if !errors.As(err, &in) || in.Field != "hits_addend" {
			t.Fatalf("err = %v, want a *descriptors.InputError on hits_addend", err)
		}
	})
}

// TestClientValuesBounded: what a client controls through Envoy (a header's
// value, a descriptor's hits_addend) never fails the request, which Envoy
// would grant whole under failure_mode_deny: false. A value over
// descriptors.MaxLen is decided under a bounded stand-in: one per value, the
// same in every call; a hits_addend over the most hits asks for the most.
func TestClientValuesBounded(t *testing.T) {
	fs := &fakeStore{}
	e := newEngine(t, fs, newClock())
	long := strings.Repeat("x", descriptors.MaxLen+100)
	other := long[:len(long)-1] + "y" // the same first MaxLen bytes
	domains := func(vals ...string) []string {
		t.Helper()
		var ds []Descriptor
		for _, v := range vals {
			ds = append(ds, desc("user", v))
		}
		if _, err := e.ShouldRateLimit(context.Background(), &Request{Domain: "test", Descriptors: ds}); err != nil {
			t.Fatalf("values of %d bytes: %v, want them decided", len(vals[0]), err)
		}
		var out []string
		for _, it := range fs.items {
			out = append(out, it.Key.Domain)
		}
		return out
	}
	got := domains(long, other, long)
	if len(got) != 3 {
		t.Fatalf("%d items sent, want 3", len(got))
	}
	if got[0] == got[1] {
		t.Errorf("two long values differing past MaxLen share one state key %q", got[0])
	}
	if got[0] != got[2] {
		t.Errorf("one long value, two state keys: %q and %q", got[0], got[2])
	}
	for _, n := range []int{0, 1, descriptors.MaxLen} {
		if v := strings.Repeat("x", n); BoundValue(v) != v {
			t.Errorf("a value of %d bytes was changed", n)
		}
	}
	if b := BoundValue(long); len(b) != descriptors.MaxLen || !strings.HasPrefix(long, b[:descriptors.MaxLen-33]) {
		t.Errorf("BoundValue of %d bytes: %d bytes, want descriptors.MaxLen keeping the value's prefix", len(long), len(b))
	}
	if again := domains(long); again[0] != got[0] {
		t.Errorf("the same long value in another request: state key %q, want %q", again[0], got[0])
	}
	_, err := e.ShouldRateLimit(context.Background(), &Request{Domain: "test", Descriptors: []Descriptor{{Entries: entries("user", "u"), Hits: 1 << 40, HasHits: true}}})
	if err != nil || len(fs.items) != 1 || fs.items[0].Hits != DefaultMaxHits {
		t.Errorf("hits_addend 2^40: %v, items %+v; want one item of %d hits", err, fs.items, int64(DefaultMaxHits))
	}
}

func TestItemsSentToStore(t *testing.T) {
	fs := &fakeStore{}
	e := newEngine(t, fs, newClock())
	req := &Request{Domain: "test", Hits: 4, Descriptors: []Descriptor{
		desc("user", "alice"),
		{Entries: entries("user", "bob"), Hits: 7, HasHits: true},
		{Entries: entries("user", "carol"), Hits: 0, HasHits: true},
		desc("nothing", "here"),
		desc("free", "x"),
		{Entries: entries("user", "dave"), Hits: 2, HasHits: true, Refund: true},
		desc("shadow", "s"),
		desc("copies", "c"),
	}}
	resp, err := e.ShouldRateLimit(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if fs.calls != 1 {
		t.Fatalf("store called %d times, want once", fs.calls)
	}
	type item struct {
		Domain         string
		Hits, Min      int64
		Refund, Shadow bool
	}
	var got []item
	for _, it := range fs.items {
		got = append(got, item{it.Key.Domain, it.Hits, it.Min, it.Refund, it.Shadow})
	}
	want := []item{
		{"alice", 4, 4, false, false},
		{"bob", 7, 7, false, false},
		{"carol", 0, 0, false, false}, // hits_addend set to 0: a check
		{"dave", 2, 2, true, false},
		{"s", 4, 4, false, true},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("items (-want +got):\n%s", diff)
	}
	if resp.Code != CodeOK {
		t.Errorf("Code = %v, want OK", resp.Code)
	}
	for i, limited := range []bool{true, true, true, false, false, true, true, false} {
		st := resp.Statuses[i]
		if (st.Limit != nil) != limited || st.Code != CodeOK {
			t.Errorf("status %d: Code %v, Limit %+v; want OK, limited %v", i, st.Code, st.Limit, limited)
		}
	}
	// envoyproxy/ratelimit's remaining: all of it for unlimited, 0 for no
	// match.
	if r3, r4 := resp.Statuses[3].Remaining, resp.Statuses[4].Remaining; r3 != 0 || r4 != math.MaxUint32 {
		t.Errorf("remaining: no match %d (want 0), unlimited %d (want %d)", r3, r4, uint32(math.MaxUint32))
	}
	if resp.Statuses[7].Match.Limit == nil || resp.Statuses[7].Match.Limit.Copies == nil {
		t.Errorf("copy-limited status does not carry its match: %+v", resp.Statuses[7].Match)
	}
}

func TestStatusMapping(t *testing.T) {
	fs := &fakeStore{answer: func(i int, it store.Item) tiers.Decision {
		switch it.Key.Domain {
		case "rejected":
			return tiers.Decision{Tier: 1, TierLimit: 3, TierWindow: time.Second, RetryAfter: 700 * time.Millisecond, ResetAfter: 700 * time.Millisecond}
		case "huge":
			return tiers.Decision{OK: true, Granted: 1, Tier: 1, TierLimit: 1 << 40, TierWindow: time.Second, Remaining: 1 << 40, ResetAfter: time.Second}
		}
		return tiers.Decision{OK: true, Granted: 1, Tier: 1, TierLimit: 3, TierWindow: time.Second, Remaining: 2, ResetAfter: 300 * time.Millisecond}
	}}
	e := newEngine(t, fs, newClock())
	resp, err := e.ShouldRateLimit(context.Background(), &Request{Domain: "test", Descriptors: []Descriptor{
		desc("user", "ok"), desc("user", "rejected"), desc("user", "huge"),
	}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Code != CodeOverLimit {
		t.Errorf("Code = %v, want OVER_LIMIT", resp.Code)
	}
	type st struct {
		Code      Code
		Limit     CurrentLimit
		Remaining uint32
		Reset     time.Duration
	}
	var got []st
	for _, s := range resp.Statuses {
		got = append(got, st{s.Code, *s.Limit, s.Remaining, s.ResetAfter})
	}
	want := []st{
		{CodeOK, CurrentLimit{RequestsPerUnit: 3, Unit: tiers.UnitSecond, Name: "per_user"}, 2, 300 * time.Millisecond},
		{CodeOverLimit, CurrentLimit{RequestsPerUnit: 3, Unit: tiers.UnitSecond, Name: "per_user"}, 0, 700 * time.Millisecond},
		{CodeOK, CurrentLimit{RequestsPerUnit: 1<<32 - 1, Unit: tiers.UnitSecond, Name: "per_user"}, 1<<32 - 1, time.Second},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("statuses (-want +got):\n%s", diff)
	}
}

func TestCurrentLimit(t *testing.T) {
	e := New(Options{Store: &fakeStore{}})
	named := &descriptors.Limit{Name: "n"}
	multi := &tiers.Policy{Kind: tiers.KindTiers, Tiers: make([]tiers.Tier, 2)}
	multi.Tiers[0] = tiers.Tier{Limit: 2, Window: time.Second}
	tests := []struct {
		name string
		p    *tiers.Policy
		d    tiers.Decision
		o    *Override
		want CurrentLimit
	}{
		{"one second", lyft(5, time.Second), tiers.Decision{Tier: 1, TierLimit: 5, TierWindow: time.Second}, nil, CurrentLimit{5, tiers.UnitSecond, 0, "n"}},
		{"one minute", lyft(5, time.Minute), tiers.Decision{Tier: 1, TierLimit: 5, TierWindow: time.Minute}, nil, CurrentLimit{5, tiers.UnitMinute, 0, "n"}},
		{"two seconds", lyft(5, 2*time.Second), tiers.Decision{Tier: 1, TierLimit: 5, TierWindow: 2 * time.Second}, nil, CurrentLimit{5, tiers.UnitSecond, 2, "5 per 2s"}},
		{"90 minutes", lyft(5, 90*time.Minute), tiers.Decision{Tier: 1, TierLimit: 5, TierWindow: 90 * time.Minute}, nil, CurrentLimit{5, tiers.UnitMinute, 90, "5 per 90m"}},
		{"two days", lyft(5, 48*time.Hour), tiers.Decision{Tier: 1, TierLimit: 5, TierWindow: 48 * time.Hour}, nil, CurrentLimit{5, tiers.UnitDay, 2, "5 per 2d"}},
		{"sub-second", lyft(5, 500*time.Millisecond), tiers.Decision{Tier: 1, TierLimit: 5, TierWindow: 500 * time.Millisecond}, nil, CurrentLimit{5, tiers.UnitSecond, 0, "5 per 500ms"}},
		{"multi-tier", multi, tiers.Decision{Tier: 2, TierLimit: 10, TierWindow: time.Minute}, nil, CurrentLimit{10, tiers.UnitMinute, 0, "10 per 1m, tier 2"}},
		{"virtual tier reports tier 1", multi, tiers.Decision{}, nil, CurrentLimit{2, tiers.UnitSecond, 0, "2 per 1s, tier 1"}},
		{"fixed window", &tiers.Policy{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Limit: 9, Unit: tiers.UnitWeek}}, tiers.Decision{}, nil, CurrentLimit{9, tiers.UnitWeek, 0, "n"}},
		// A request's own limit of 0 (its policy has no tier) reports the
		// unit asked and no name, as envoyproxy/ratelimit does.
		{"own limit of 0", &tiers.Policy{Kind: tiers.KindTiers}, tiers.Decision{}, &Override{Unit: tiers.UnitMinute}, CurrentLimit{0, tiers.UnitMinute, 0, ""}},
		{"own limit of 0 per 3 hours", &tiers.Policy{Kind: tiers.KindTiers}, tiers.Decision{}, &Override{Unit: tiers.UnitHour, Multiplier: 3}, CurrentLimit{0, tiers.UnitHour, 3, ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := descriptors.Match{Limit: named, Policy: tt.p}
			if diff := cmp.Diff(tt.want, e.currentLimit(&m, &tt.d, tt.o)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestStoreErrorIsReturned(t *testing.T) {
	boom := errors.New("boom")
	e := newEngine(t, &fakeStore{err: boom}, newClock())
	_, err := e.ShouldRateLimit(context.Background(), &Request{Domain: "test", Descriptors: []Descriptor{desc("user", "u")}})
	if !errors.Is(err, ErrStore) || !errors.Is(err, boom) {
		t.Fatalf("err = %v, want ErrStore wrapping the store's error", err)
	}
}

func TestNotLimited(t *testing.T) {
	fs := &fakeStore{}
	e := New(Options{Store: fs})
	req := &Request{Domain: "test", Descriptors: []Descriptor{desc("user", "u")}}
	resp, err := e.ShouldRateLimit(context.Background(), req) // no tree yet
	if err != nil || resp.Code != CodeOK || resp.Statuses[0].Limit != nil || !resp.UnknownDomain {
		t.Fatalf("without a tree: %+v, %v; want OK, not limited, unknown domain", resp, err)
	}
	e.SetTree(testTree(t))
	for _, r := range []*Request{
		{Domain: "unknown", Descriptors: []Descriptor{desc("user", "u"), {Entries: entries("user", "u"), Override: &Override{RequestsPerUnit: 1, Unit: tiers.UnitSecond}}}},
		{Domain: "test", Descriptors: []Descriptor{desc("nope", "u"), desc("path", "/x"), desc("free", "f"), desc("user", "u", "extra", "e")}},
	} {
		resp, err := e.ShouldRateLimit(context.Background(), r)
		if err != nil || resp.Code != CodeOK {
			t.Fatalf("%+v: %+v, %v; want OK", r, resp, err)
		}
		if want := r.Domain == "unknown"; resp.UnknownDomain != want {
			t.Errorf("%s: UnknownDomain %v, want %v", r.Domain, resp.UnknownDomain, want)
		}
		for i, st := range resp.Statuses {
			if st.Code != CodeOK || st.Limit != nil {
				t.Errorf("%s descriptor %d: %+v, want OK, not limited", r.Domain, i, st)
			}
		}
	}
	if fs.calls != 0 {
		t.Errorf("store called %d times for unlimited descriptors", fs.calls)
	}
}

// TestZeroEngineIsUsable: with no tree nothing is limited; with one, a
// rate-limited descriptor fails with ErrNoStore, for want of a store.
func TestZeroEngineIsUsable(t *testing.T) {
	var e Engine
	resp, err := e.ShouldRateLimit(context.Background(), &Request{Domain: "d", Descriptors: []Descriptor{desc("k", "v")}})
	if err != nil || resp.Code != CodeOK {
		t.Fatalf("zero Engine: %+v, %v", resp, err)
	}
	e.SetTree(testTree(t))
	_, err = e.ShouldRateLimit(context.Background(), one("user", "u"))
	if !errors.Is(err, ErrStore) || !errors.Is(err, ErrNoStore) {
		t.Errorf("no store: err = %v, want ErrStore and ErrNoStore", err)
	}
	_, err = e.Request(context.Background(), "test", entries("user", "u"), 1, 1)
	if !errors.Is(err, ErrStore) || !errors.Is(err, ErrNoStore) {
		t.Errorf("Request with no store: err = %v, want ErrStore and ErrNoStore", err)
	}
}

// The flows below run on the real in-memory store and the tiers package.

func ask(t *testing.T, e *Engine, req *Request) *Response {
	t.Helper()
	resp, err := e.ShouldRateLimit(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func codes(r *Response) []Code {
	cs := []Code{r.Code}
	for _, s := range r.Statuses {
		cs = append(cs, s.Code)
	}
	return cs
}

func wantCodes(t *testing.T, what string, r *Response, want ...Code) {
	t.Helper()
	if diff := cmp.Diff(want, codes(r)); diff != "" {
		t.Fatalf("%s: codes [overall, statuses...] (-want +got):\n%s", what, diff)
	}
}

const ok, over = CodeOK, CodeOverLimit

func memEngine(t *testing.T, c *clock) *Engine {
	st := memstore.New(memstore.Options{})
	t.Cleanup(func() { st.Close() })
	return newEngine(t, st, c)
}

func one(kv ...string) *Request {
	return &Request{Domain: "test", Descriptors: []Descriptor{desc(kv...)}}
}

func TestLimitAndClock(t *testing.T) {
	c := newClock()
	e := memEngine(t, c)
	for i := range 3 {
		r := ask(t, e, one("user", "alice"))
		wantCodes(t, "grant", r, ok, ok)
		if got := r.Statuses[0].Remaining; got != uint32(2-i) {
			t.Errorf("hit %d: Remaining = %d, want %d", i, got, 2-i)
		}
	}
	r := ask(t, e, one("user", "alice"))
	wantCodes(t, "fourth", r, over, over)
	if r.Statuses[0].ResetAfter <= 0 || r.Statuses[0].ResetAfter > time.Second {
		t.Errorf("ResetAfter = %v, want in (0, 1s]", r.Statuses[0].ResetAfter)
	}
	wantCodes(t, "another user", ask(t, e, one("user", "bob")), ok, ok)
	c.Advance(time.Second)
	wantCodes(t, "a second later", ask(t, e, one("user", "alice")), ok, ok)
}

func TestAllOrNothingAcrossDescriptors(t *testing.T) {
	e := memEngine(t, newClock())
	wantCodes(t, "exhaust bob", ask(t, e, &Request{Domain: "test", Hits: 3, Descriptors: []Descriptor{desc("user", "bob")}}), ok, ok)
	// alice's descriptor would be granted, bob's is not: nothing is consumed.
	for range 5 {
		r := ask(t, e, &Request{Domain: "test", Descriptors: []Descriptor{desc("user", "alice"), desc("user", "bob")}})
		wantCodes(t, "alice and bob", r, over, ok, over)
	}
	wantCodes(t, "alice still has 3", ask(t, e, &Request{Domain: "test", Hits: 3, Descriptors: []Descriptor{desc("user", "alice")}}), ok, ok)
}

func TestHitsAreAllOrNothing(t *testing.T) {
	e := memEngine(t, newClock())
	wantCodes(t, "4 of 3", ask(t, e, &Request{Domain: "test", Hits: 4, Descriptors: []Descriptor{desc("user", "u")}}), over, over)
	wantCodes(t, "2 of 3", ask(t, e, &Request{Domain: "test", Descriptors: []Descriptor{{Entries: entries("user", "u"), Hits: 2, HasHits: true}}}), ok, ok)
	wantCodes(t, "2 of 1", ask(t, e, &Request{Domain: "test", Hits: 2, Descriptors: []Descriptor{desc("user", "u")}}), over, over)
	wantCodes(t, "1 of 1", ask(t, e, one("user", "u")), ok, ok)
}

func TestRefunds(t *testing.T) {
	e := memEngine(t, newClock())
	wantCodes(t, "take 3", ask(t, e, &Request{Domain: "test", Hits: 3, Descriptors: []Descriptor{desc("user", "u")}}), ok, ok)
	wantCodes(t, "full", ask(t, e, one("user", "u")), over, over)
	r := ask(t, e, &Request{Domain: "test", Descriptors: []Descriptor{{Entries: entries("user", "u"), Hits: 2, HasHits: true, Refund: true}}})
	wantCodes(t, "refund 2", r, ok, ok)
	wantCodes(t, "take 2", ask(t, e, &Request{Domain: "test", Hits: 2, Descriptors: []Descriptor{desc("user", "u")}}), ok, ok)
	wantCodes(t, "full again", ask(t, e, one("user", "u")), over, over)
}

func TestShadowModeAndIgnoreLimits(t *testing.T) {
	e := memEngine(t, newClock())
	wantCodes(t, "shadow first", ask(t, e, one("shadow", "s")), ok, ok)
	r := ask(t, e, &Request{Domain: "test", Descriptors: []Descriptor{desc("shadow", "s"), desc("user", "u")}})
	wantCodes(t, "shadow over, user ok", r, ok, ok, ok)
	if !r.Statuses[0].Shadow || r.Statuses[1].Shadow {
		t.Errorf("Shadow = %v, %v; want true, false", r.Statuses[0].Shadow, r.Statuses[1].Shadow)
	}
	if r.Statuses[0].Decision.OK {
		t.Errorf("shadow status does not record the rejection: %+v", r.Statuses[0].Decision)
	}
	// The user descriptor was counted despite the shadow rejection.
	wantCodes(t, "user has 2 left", ask(t, e, &Request{Domain: "test", Hits: 3, Descriptors: []Descriptor{desc("user", "u")}}), over, over)

	kill := &Request{Domain: "kill", Descriptors: []Descriptor{desc("user", "u")}}
	wantCodes(t, "ignore_limits first", ask(t, e, kill), ok, ok)
	r = ask(t, e, kill)
	wantCodes(t, "ignore_limits second", r, ok, ok)
	if !r.Statuses[0].Shadow {
		t.Errorf("ignore_limits over the limit: Shadow false, want true")
	}
}

func TestOverrides(t *testing.T) {
	c := newClock()
	e := memEngine(t, c)
	o := &Override{RequestsPerUnit: 2, Unit: tiers.UnitSecond, Multiplier: 3}
	req := &Request{Domain: "test", Descriptors: []Descriptor{{Entries: entries("user", "u"), Override: o}}}
	r := ask(t, e, req)
	wantCodes(t, "first", r, ok, ok)
	if diff := cmp.Diff(CurrentLimit{2, tiers.UnitSecond, 3, "2 per 3s"}, *r.Statuses[0].Limit); diff != "" {
		t.Errorf("override limit (-want +got):\n%s", diff)
	}
	wantCodes(t, "second", ask(t, e, req), ok, ok)
	wantCodes(t, "third", ask(t, e, req), over, over)
	// The configured limit of user=u (3/s) is untouched.
	wantCodes(t, "configured", ask(t, e, &Request{Domain: "test", Hits: 3, Descriptors: []Descriptor{desc("user", "u")}}), ok, ok)
	// Another descriptor with the same override has its own state.
	wantCodes(t, "other entries", ask(t, e, &Request{Domain: "test", Descriptors: []Descriptor{{Entries: entries("user", "v"), Override: o}}}), ok, ok)
	// An override matches even an unconfigured descriptor of a known domain.
	wantCodes(t, "unconfigured", ask(t, e, &Request{Domain: "test", Descriptors: []Descriptor{{Entries: entries("nope", "x"), Override: o}}}), ok, ok)
	c.Advance(3 * time.Second)
	wantCodes(t, "after the window", ask(t, e, req), ok, ok)
	// Zero requests per unit rejects.
	zero := &Request{Domain: "test", Descriptors: []Descriptor{{Entries: entries("user", "z"), Override: &Override{Unit: tiers.UnitMinute}}}}
	wantCodes(t, "zero", ask(t, e, zero), over, over)
}

func TestReplaces(t *testing.T) {
	e := memEngine(t, newClock())
	// b replaces A: only b's 10/s applies to the pair.
	for i := range 6 {
		r := ask(t, e, &Request{Domain: "test", Descriptors: []Descriptor{desc("a", "x"), desc("b", "y")}})
		wantCodes(t, "a and b", r, ok, ok, ok)
		if r.Statuses[0].Limit != nil || !r.Statuses[0].Match.Replaced {
			t.Fatalf("request %d: replaced status %+v, want not limited and Replaced", i, r.Statuses[0])
		}
	}
	for range 5 {
		wantCodes(t, "a alone still has 5", ask(t, e, one("a", "x")), ok, ok)
	}
	wantCodes(t, "a alone, sixth", ask(t, e, one("a", "x")), over, over)
}

func TestSetTreeSwapsLimits(t *testing.T) {
	e := memEngine(t, newClock())
	wantCodes(t, "limited", ask(t, e, &Request{Domain: "test", Hits: 4, Descriptors: []Descriptor{desc("user", "u")}}), over, over)
	e.SetTree(nil)
	wantCodes(t, "no tree", ask(t, e, &Request{Domain: "test", Hits: 4, Descriptors: []Descriptor{desc("user", "u")}}), ok, ok)
}

func TestDecideReusesResponse(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under -race")
	}
	e := memEngine(t, newClock())
	req := &Request{Domain: "test", Descriptors: []Descriptor{desc("user", "u"), desc("other", "v")}}
	var resp Response
	if err := e.Decide(context.Background(), req, &resp); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(200, func() {
		if err := e.Decide(context.Background(), req, &resp); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 0 {
		t.Errorf("Decide with a reused Response: %v allocs per request, want 0", allocs)
	}
	if resp.Statuses[0].Limit == resp.Statuses[1].Limit {
		t.Errorf("statuses share one CurrentLimit")
	}
}
