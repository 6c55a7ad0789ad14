package deploy

import (
	"regexp"
	"strings"
	"testing"
	"testing/fstest"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	"gopkg.in/yaml.v3"

	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/engine"
)

// TestDocsConcurrencyRecipe: the two blocks of docs/configuration.md's
// "Concurrency limits" are a Charon configuration that loads, with a
// concurrency limit on its descriptor, and an Envoy route that decodes as
// Envoy's own types and passes their validation (its per-route rate limit
// config unpacked and validated too), whose two rate limits are the take
// and the stream-done refund that reads back what Charon's answer names:
// charon.slots as a negative hits_addend, charon.slot as the last entry
// (engine.SlotKey), dropping the refund when the answer named none. Both
// name the descriptor the Charon rule limits.
func TestDocsConcurrencyRecipe(t *testing.T) {
	for _, src := range []struct{ file, heading string }{
		{"../docs/configuration.md", "## Concurrency limits\n"},
		{"../README.md", "### In-flight limits\n"},
	} {
		t.Run(src.file, func(t *testing.T) {
			doc := string(readFile(t, src.file))
			_, section, ok := strings.Cut(doc, src.heading)
			if !ok {
				t.Fatalf("%s has no section %q", src.file, src.heading)
			}
			section, _, _ = strings.Cut(section, "\n## ")
			blocks := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(section, -1)
			if len(blocks) != 2 {
				t.Fatalf("%d yaml blocks in the section, want 2 (Charon's, Envoy's)", len(blocks))
			}
			checkConcurrencyRecipe(t, blocks[0][1], blocks[1][1])
		})
	}
}

// checkConcurrencyRecipe checks a Charon rule and the Envoy route beside it:
// the rule loads as a concurrency limit; the route validates with Envoy's
// types and takes the slot, then gives back the one the answer names.
func checkConcurrencyRecipe(t *testing.T, charonYAML, envoyYAML string) {
	// Charon's rule.
	cfg, _, err := config.Load(fstest.MapFS{"llm.yaml": {Data: []byte(charonYAML)}}, config.Options{})
	if err != nil {
		t.Fatalf("the Charon block does not load: %v", err)
	}
	m, ok := cfg.Tree.Match("llm", []descriptors.Entry{{Key: "tenant", Value: "acme"}})
	if !ok || m.Policy == nil || !m.Policy.Concurrency {
		t.Fatalf("tenant=acme: %+v, want a concurrency limit", m.Policy)
	}

	// Envoy's route.
	var v any
	if err := yaml.Unmarshal([]byte(envoyYAML), &v); err != nil {
		t.Fatal(err)
	}
	var route routev3.Route
	decode(t, "docs route", v, &route)
	if n := validateDeep(t, "docs route", &route); n < 2 {
		t.Errorf("validated %d messages, want the route and its rate limit config", n)
	}
	var per ratelimitv3.RateLimitPerRoute
	if err := route.GetTypedPerFilterConfig()["envoy.filters.http.ratelimit"].UnmarshalTo(&per); err != nil {
		t.Fatalf("typed_per_filter_config of envoy.filters.http.ratelimit: %v", err)
	}
	rls := per.GetRateLimits()
	if len(rls) != 2 {
		t.Fatalf("%d rate limits, want 2 (the take, the stream-done refund)", len(rls))
	}
	take, done := rls[0], rls[1]
	if take.GetApplyOnStreamDone() || take.GetHitsAddend() != nil {
		t.Errorf("the take %v: applied on stream done or with a hits_addend", take)
	}
	if !done.GetApplyOnStreamDone() {
		t.Error("the refund is not applied on stream done")
	}
	ha := done.GetHitsAddend()
	if !ha.GetIsNegativeHits() || ha.GetNumber() != nil || ha.GetFormat() != "%DYNAMIC_METADATA(envoy.filters.http.ratelimit:charon:slots)%" {
		t.Errorf("the refund's hits_addend %v: want is_negative_hits and the format reading charon.slots", ha)
	}
	// The descriptor both send: the same keys, the refund's with the slot
	// entry last, read from the answer's metadata (no default, not
	// skipped: absent, no refund).
	keys := func(r *routev3.RateLimit) []string {
		var ks []string
		for _, a := range r.GetActions() {
			switch {
			case a.GetRequestHeaders() != nil:
				ks = append(ks, a.GetRequestHeaders().GetDescriptorKey())
			case a.GetMetadata() != nil:
				ks = append(ks, a.GetMetadata().GetDescriptorKey())
			default:
				t.Errorf("an action of another kind than the docs explain: %v", a)
			}
		}
		return ks
	}
	tk, dk := keys(take), keys(done)
	if len(dk) != len(tk)+1 || strings.Join(dk[:len(tk)], ",") != strings.Join(tk, ",") || dk[len(tk)] != engine.SlotKey {
		t.Errorf("descriptor keys: take %v, refund %v; want the take's then %s", tk, dk, engine.SlotKey)
	}
	if len(tk) == 0 || tk[0] != "tenant" {
		t.Errorf("the take's descriptor %v does not name the rule's key tenant", tk)
	}
	md := done.GetActions()[len(done.GetActions())-1].GetMetadata()
	path := []string{}
	for _, s := range md.GetMetadataKey().GetPath() {
		path = append(path, s.GetKey())
	}
	if md.GetSource() != routev3.RateLimit_Action_MetaData_DYNAMIC || md.GetMetadataKey().GetKey() != "envoy.filters.http.ratelimit" ||
		strings.Join(path, ".") != "charon.slot" || md.GetDefaultValue() != "" || md.GetSkipIfAbsent() {
		t.Errorf("the slot's metadata action %v: want dynamic envoy.filters.http.ratelimit charon.slot, no default, not skipped", md)
	}
}
