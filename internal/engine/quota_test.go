package engine

import (
	"context"
	"testing"
	"time"

	"github.com/charonlimit/charon/descriptors"
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
