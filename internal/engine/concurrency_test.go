package engine

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/tiers"
)

// concEngine is an engine over a memory store with the tree: tenant, a
// concurrency limit of 2 slots living ttl; shadow, the same in shadow mode;
// rate, 1 per hour.
func concEngine(t *testing.T, c *clock, ttl time.Duration) *Engine {
	t.Helper()
	st := memstore.New(memstore.Options{})
	t.Cleanup(func() { st.Close() })
	e := New(Options{Store: st, Now: c.Now})
	conc := func() *tiers.Policy {
		return &tiers.Policy{Kind: tiers.KindTiers, Concurrency: true, Tiers: []tiers.Tier{{Limit: 2, Window: ttl, Active: tiers.Unbounded}}}
	}
	tree, err := descriptors.NewTree([]descriptors.DomainSpec{{Config: descriptors.DomainConfig{Name: "test"}, Nodes: []*descriptors.Node{
		{Key: "tenant", Limit: &descriptors.Limit{Policy: conc()}},
		{Key: "shadow", Limit: &descriptors.Limit{Policy: conc(), ShadowMode: true}},
		{Key: "rate", Limit: &descriptors.Limit{Policy: &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 1, Window: time.Hour, Active: tiers.Unbounded}}}}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	e.SetTree(tree)
	return e
}

// refundOf is the stream-done refund Envoy sends for resp's slots, the
// take named by its last entry (SlotKey), as the recipe in
// docs/configuration.md builds it.
func refundOf(resp *Response, kv ...string) *Request {
	d := desc(kv...)
	d.Refund, d.HasHits, d.Hits = true, true, uint64(resp.Slots)
	d.Entries = append(d.Entries, descriptors.Entry{Key: SlotKey, Value: strconv.FormatInt(resp.SlotsAt.UnixMicro(), 10)})
	return &Request{Domain: "test", Descriptors: []Descriptor{d}}
}

// TestConcurrencySlots: a granted request holds its slots (Response.Slots,
// SlotsAt), and its refund naming them gives back its own, not an older
// request's; a rejected request, or one whose take was not committed,
// holds none.
func TestConcurrencySlots(t *testing.T) {
	c := newClock()
	e := concEngine(t, c, 10*time.Second)
	a := ask(t, e, one("tenant", "acme"))
	if a.Code != CodeOK || a.Slots != 1 || !a.SlotsAt.Equal(c.now) {
		t.Fatalf("first: %v, %d slots at %v; want OK, 1 slot at %v", a.Code, a.Slots, a.SlotsAt, c.now)
	}
	if l := a.Statuses[0].Limit; l == nil || l.Name != "2 in flight, ttl 10s" || l.RequestsPerUnit != 2 {
		t.Errorf("limit %+v, want 2 named \"2 in flight, ttl 10s\"", l)
	}
	c.Advance(5 * time.Second)
	b := ask(t, e, one("tenant", "acme"))
	third := ask(t, e, one("tenant", "acme"))
	if b.Code != CodeOK || third.Code != CodeOverLimit || third.Slots != 0 || !third.SlotsAt.IsZero() {
		t.Fatalf("second %v, third %v holding %d: want OK, OVER_LIMIT holding none", b.Code, third.Code, third.Slots)
	}
	// b ends at 6 and gives back its own slot; a's (its client gone) lives
	// until 10.
	c.Advance(time.Second)
	if r := ask(t, e, refundOf(b, "tenant", "acme")); r.Code != CodeOK || r.Slots != 0 {
		t.Fatalf("refund: %v holding %d", r.Code, r.Slots)
	}
	if r := ask(t, e, one("tenant", "acme")); r.Code != CodeOK {
		t.Fatal("no slot after b's refund")
	}
	if r := ask(t, e, one("tenant", "acme")); r.Code != CodeOverLimit {
		t.Fatal("a third slot while a's lives")
	}
	c.Advance(4 * time.Second) // 10: a's slot freed itself
	if r := ask(t, e, one("tenant", "acme")); r.Code != CodeOK {
		t.Fatal("a's slot still held at its ttl")
	}

	// A request over another limit commits nothing: it holds no slot,
	// and its answer says so.
	both := &Request{Domain: "test", Descriptors: []Descriptor{desc("tenant", "other"), desc("rate", "x")}}
	if r := ask(t, e, both); r.Code != CodeOK || r.Slots != 1 {
		t.Fatalf("tenant and rate: %v holding %d, want OK holding 1", r.Code, r.Slots)
	}
	if r := ask(t, e, both); r.Code != CodeOverLimit || r.Slots != 0 {
		t.Fatalf("rate over: %v holding %d, want OVER_LIMIT holding none", r.Code, r.Slots)
	}
	// A shadow concurrency limit over its slots answers OK but took none;
	// beside another concurrency limit that took one, the request names
	// none: the refund would go to both.
	for range 2 {
		ask(t, e, one("shadow", "s"))
	}
	if r := ask(t, e, one("shadow", "s")); r.Code != CodeOK || r.Slots != 0 || !r.Statuses[0].Shadow {
		t.Fatalf("shadow over: %v holding %d shadow %v, want OK holding none", r.Code, r.Slots, r.Statuses[0].Shadow)
	}
	pair := &Request{Domain: "test", Descriptors: []Descriptor{desc("tenant", "third"), desc("shadow", "s")}}
	if r := ask(t, e, pair); r.Code != CodeOK || r.Slots != 0 || r.Statuses[0].Decision.Granted != 1 {
		t.Fatalf("a take beside a shadow limit over its slots: %v holding %d (granted %d), want OK holding none",
			r.Code, r.Slots, r.Statuses[0].Decision.Granted)
	}
	check := desc("tenant", "fourth")
	check.HasHits = true
	if r := ask(t, e, &Request{Domain: "test", Descriptors: []Descriptor{check}}); r.Code != CodeOK || r.Slots != 0 {
		t.Fatalf("a check of 0 hits: %v holding %d, want OK holding none", r.Code, r.Slots)
	}
}

// TestConcurrencySlotEntry: the entry naming a refund's take is read off
// only a refund's last entry; a bad one is an input error naming it.
func TestConcurrencySlotEntry(t *testing.T) {
	c := newClock()
	e := concEngine(t, c, time.Minute)
	take := desc("tenant", "acme", SlotKey, "123")
	if r := ask(t, e, &Request{Domain: "test", Descriptors: []Descriptor{take}}); r.Statuses[0].Limit != nil {
		t.Error("a take's slot entry was read off: it matched the tenant's limit")
	}
	for _, v := range []string{"soon", "-5", "0", ""} {
		d := desc("tenant", "acme", SlotKey, v)
		d.Refund = true
		_, err := e.ShouldRateLimit(context.Background(), &Request{Domain: "test", Descriptors: []Descriptor{d}})
		var ie *descriptors.InputError
		if !errors.As(err, &ie) || ie.Field != "descriptors[0].entries[1].value" {
			t.Errorf("%q: got %v, want an input error naming descriptors[0].entries[1].value", v, err)
		}
	}
	d := desc(SlotKey, "5")
	d.Refund = true
	_, err := e.ShouldRateLimit(context.Background(), &Request{Domain: "test", Descriptors: []Descriptor{d}})
	var ie *descriptors.InputError
	if !errors.As(err, &ie) || ie.Field != "descriptors[0].entries" {
		t.Errorf("only a slot entry: got %v, want descriptors[0].entries empty", err)
	}
}
