package config

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/charonlimit/charon/tiers"
)

// TestLoadConcurrency: concurrency: {limit, ttl} is a concurrency limit of
// one tier, with per-domain overrides of its own kind; the server's
// post-paid default does not apply to it; it dumps as written.
func TestLoadConcurrency(t *testing.T) {
	text := `domain: api
descriptors:
  - key: tenant
    concurrency: {limit: 10, ttl: 5m}
    overrides:
      - domain: big
        concurrency: {limit: 50, ttl: 5m}
`
	for _, opts := range []Options{{}, {OverdraftDefault: true}} {
		cfg, _, err := load(t, opts, "api.yaml", text)
		if err != nil {
			t.Fatal(err)
		}
		m, ok := cfg.Tree.Match("api", e("tenant", "acme"))
		if !ok || m.Policy == nil {
			t.Fatal("no match")
		}
		want := &tiers.Policy{Kind: tiers.KindTiers, Concurrency: true, Tiers: []tiers.Tier{{Limit: 10, Window: 5 * time.Minute, Active: tiers.Unbounded}}}
		if diff := cmp.Diff(want, m.Policy); diff != "" {
			t.Errorf("overdraft default %v: policy (-want +got):\n%s", opts.OverdraftDefault, diff)
		}
		big, _ := cfg.Tree.Match("api", e("tenant", "big"))
		if big.Policy == nil || !big.Policy.Concurrency || big.Policy.Tiers[0].Limit != 50 || big.Policy.Overdraft {
			t.Errorf("override: got %+v, want a concurrency limit of 50", big.Policy)
		}
		if m.Shape == (&tiers.Policy{Kind: tiers.KindTiers, Tiers: want.Tiers}).Shape() {
			t.Error("a concurrency limit keys its state as a sliding window of its ttl does")
		}
		dump, err := cfg.Dump()
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []string{"algorithm: concurrency", "concurrency:\n", "limit: 10", "ttl: 5m"} {
			if !strings.Contains(string(dump), s) {
				t.Errorf("dump has no %q:\n%s", s, dump)
			}
		}
	}
	if got := DescribePolicy(&tiers.Policy{Kind: tiers.KindTiers, Concurrency: true, Tiers: []tiers.Tier{{Limit: 10, Window: 5 * time.Minute, Active: tiers.Unbounded}}}); got != "10 in flight, ttl 5m" {
		t.Errorf("DescribePolicy = %q", got)
	}
}

// TestLoadConcurrencyErrors: each bad concurrency block is refused with an
// error naming the field, and so is every key a concurrency limit cannot
// go with.
func TestLoadConcurrencyErrors(t *testing.T) {
	head := "domain: api\ndescriptors:\n  - key: a\n"
	for _, tc := range []struct{ name, text, want string }{
		{"limit 0", "    concurrency: {limit: 0, ttl: 1m}\n", "api.yaml:4: descriptors[0].concurrency.limit: must be >= 1"},
		{"limit negative", "    concurrency: {limit: -2, ttl: 1m}\n", "api.yaml:4: descriptors[0].concurrency.limit: must be >= 1"},
		{"limit too large", "    concurrency: {limit: 2000000000000, ttl: 1m}\n", "api.yaml:4: descriptors[0].concurrency.limit: must be <= 1099511627776"},
		{"ttl 0", "    concurrency: {limit: 5, ttl: 0s}\n", "api.yaml:4: descriptors[0].concurrency.ttl: must be > 0"},
		{"ttl negative", "    concurrency: {limit: 5, ttl: -1s}\n", "api.yaml:4: descriptors[0].concurrency.ttl: must be >= 0"},
		{"ttl unbounded", "    concurrency: {limit: 5, ttl: unbounded}\n", "api.yaml:4: descriptors[0].concurrency.ttl: must be a finite duration"},
		{"ttl no unit", "    concurrency: {limit: 5, ttl: 30}\n", `api.yaml:4: descriptors[0].concurrency.ttl: must be a duration such as 1s, 5m or 24h, not "30" (give a unit: 30s?)`},
		{"ttl missing", "    concurrency: {limit: 5}\n", "api.yaml:4: descriptors[0].concurrency.ttl: missing"},
		{"limit missing", "    concurrency: {ttl: 5s}\n", "api.yaml:4: descriptors[0].concurrency.limit: missing"},
		{"unknown key", "    concurrency: {limit: 5, ttl: 5s, window: 1s}\n", `api.yaml:4: descriptors[0].concurrency.window: unknown key "window"`},
		{"not a mapping", "    concurrency: 5\n", "api.yaml:4: descriptors[0].concurrency: must be a mapping"},
		{"with rate_limit", "    rate_limit: {unit: second, requests_per_unit: 1}\n    concurrency: {limit: 5, ttl: 5s}\n", "api.yaml:5: descriptors[0].concurrency: a descriptor has exactly one policy: rate_limit and concurrency both given"},
		{"with token_bucket", "    concurrency: {limit: 5, ttl: 5s}\n    token_bucket: {capacity: 5, refill: 1, per: 1s}\n", "a descriptor has exactly one policy: token_bucket and concurrency both given"},
		{"with copies", "    concurrency: {limit: 5, ttl: 5s}\n    copies: {domain_limit: 5}\n", "a descriptor has exactly one policy: concurrency and copies both given"},
		{"hard_limit", "    concurrency: {limit: 5, ttl: 5s}\n    hard_limit: 3\n", "api.yaml:5: descriptors[0].hard_limit: does not apply to a concurrency limit"},
		{"global_limit", "    concurrency: {limit: 5, ttl: 5s}\n    global_limit: 3\n", "api.yaml:5: descriptors[0].global_limit: does not apply to a concurrency limit"},
		{"overdraft", "    concurrency: {limit: 5, ttl: 5s}\n    overdraft: true\n", "api.yaml:5: descriptors[0].overdraft: does not apply to a concurrency limit"},
		{"pace", "    concurrency: {limit: 5, ttl: 5s}\n    pace: 1s\n", "api.yaml:5: descriptors[0].pace: does not apply to a concurrency limit"},
		{"quota", "    concurrency: {limit: 5, ttl: 5s}\n    quota: {limit: 100, period: day}\n", "api.yaml:5: descriptors[0].quota: does not apply to a concurrency limit"},
		{"rate override", "    concurrency: {limit: 5, ttl: 5s}\n    overrides:\n      - domain: x\n        rate_limit: {unit: second, requests_per_unit: 1}\n", "api.yaml:7: descriptors[0].overrides[0].rate_limit: an override of a concurrency limit gives concurrency: {limit, ttl}"},
		{"concurrency override of a rate", "    rate_limit: {unit: second, requests_per_unit: 1}\n    overrides:\n      - domain: x\n        concurrency: {limit: 5, ttl: 5s}\n", "api.yaml:7: descriptors[0].overrides[0].concurrency: a concurrency override needs a concurrency limit on the descriptor"},
		{"override hard_limit", "    concurrency: {limit: 5, ttl: 5s}\n    overrides:\n      - domain: x\n        concurrency: {limit: 5, ttl: 5s}\n        hard_limit: 2\n", "api.yaml:8: descriptors[0].overrides[0].hard_limit: does not apply to a concurrency limit"},
		{"override bad ttl", "    concurrency: {limit: 5, ttl: 5s}\n    overrides:\n      - domain: x\n        concurrency: {limit: 5, ttl: 0s}\n", "api.yaml:7: descriptors[0].overrides[0].concurrency.ttl: must be > 0"},
	} {
		_, _, err := load(t, Options{}, "api.yaml", head+tc.text)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got error %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}
