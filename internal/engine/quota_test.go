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
