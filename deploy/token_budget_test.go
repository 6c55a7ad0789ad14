package deploy

import (
	"regexp"
	"strings"
	"testing"
	"testing/fstest"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	"github.com/charonlimit/charon/config"
)

// TestTokenBudgetRoute: the reserve-then-settle route of
// docs/token-budgets.md decodes as Envoy's own types and passes their
// validation; its three rate limits send one descriptor (tenant) and
// reserve an estimate at the request, give the same estimate back
// (is_negative_hits) and debit AI Gateway's token count when the stream
// ends; the page shows the file as it is, and its Charon rule loads and is
// post-paid.
func TestTokenBudgetRoute(t *testing.T) {
	const name = "envoy-token-budget-route.yaml"
	var r routev3.Route
	decode(t, name, readYAML(t, name), &r)
	if n := validateDeep(t, name, &r); n < 2 {
		t.Errorf("validated %d messages, want at least 2 (the route, its rate limit filter config)", n)
	}
	var per ratelimitv3.RateLimitPerRoute
	if err := r.GetTypedPerFilterConfig()["envoy.filters.http.ratelimit"].UnmarshalTo(&per); err != nil {
		t.Fatalf("typed_per_filter_config: %v", err)
	}
	rls := per.GetRateLimits()
	if per.GetDomain() != "ai" || len(rls) != 3 {
		t.Fatalf("domain %q, %d rate limits; want domain ai and 3 (reserve, give back, debit)", per.GetDomain(), len(rls))
	}
	for i, rl := range rls[1:] {
		if !proto.Equal(rl.GetActions()[0], rls[0].GetActions()[0]) || len(rl.GetActions()) != len(rls[0].GetActions()) {
			t.Errorf("rate limit %d sends another descriptor than the reservation: %v", i+1, rl.GetActions())
		}
	}
	reserve, back, debit := rls[0], rls[1], rls[2]
	estimate := reserve.GetHitsAddend().GetNumber().GetValue()
	if reserve.GetApplyOnStreamDone() || estimate == 0 || reserve.GetHitsAddend().GetIsNegativeHits() {
		t.Errorf("the reservation %v: want a positive estimate asked at the request", reserve)
	}
	if !back.GetApplyOnStreamDone() || back.GetHitsAddend().GetNumber().GetValue() != estimate || !back.GetHitsAddend().GetIsNegativeHits() {
		t.Errorf("the give-back %v: want the estimate %d with is_negative_hits at stream end", back, estimate)
	}
	if !debit.GetApplyOnStreamDone() || debit.GetHitsAddend().GetIsNegativeHits() ||
		debit.GetHitsAddend().GetFormat() != "%DYNAMIC_METADATA(io.envoy.ai_gateway:llm_total_token)%" {
		t.Errorf("the debit %v: want AI Gateway's llm_total_token at stream end", debit)
	}

	file := string(readFile(t, name))
	doc := string(readFile(t, "../docs/token-budgets.md"))
	// The page leaves out the file's leading comment.
	if body := file[strings.Index(file, "name: "):]; !strings.Contains(doc, body) {
		t.Errorf("docs/token-budgets.md does not show %s as it is", name)
	}
	rule := regexp.MustCompile("(?s)```yaml\n(# 10,000 tokens.*?)```").FindStringSubmatch(doc)
	if rule == nil {
		t.Fatal("docs/token-budgets.md: no Charon rule block")
	}
	if _, _, err := config.Load(fstest.MapFS{"ai.yaml": {Data: []byte(rule[1])}}, config.Options{}); err != nil {
		t.Errorf("the page's rule does not load: %v", err)
	}
	if !strings.Contains(rule[1], "overdraft: true") {
		t.Error("the page's rule is not post-paid")
	}
}
