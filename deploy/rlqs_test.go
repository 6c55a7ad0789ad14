package deploy

import (
	"os"
	"strings"
	"testing"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
)

// TestRLQSFilter: the rate_limit_quota filter of docs/rlqs.md decodes as
// Envoy's own types and passes their validation, and docs/rlqs.md shows it
// as it is here.
func TestRLQSFilter(t *testing.T) {
	const name = "envoy-rlqs-filter.yaml"
	var f hcmv3.HttpFilter
	decode(t, name, readYAML(t, name), &f)
	if n := validateDeep(t, name, &f); n < 3 {
		t.Errorf("validated %d messages, want at least 3 (the filter, its config, the bucket settings)", n)
	}
	var cfg rlqsv3.RateLimitQuotaFilterConfig
	if err := f.GetTypedConfig().UnmarshalTo(&cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.GetDomain() != "web" || cfg.GetRlqsServer().GetEnvoyGrpc().GetClusterName() != "charon" {
		t.Errorf("filter config %v: want domain web and the charon cluster", &cfg)
	}
	file, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../docs/rlqs.md")
	if err != nil {
		t.Fatal(err)
	}
	// The page leaves out the file's leading comment.
	body := string(file)[strings.Index(string(file), "name: "):]
	if !strings.Contains(string(doc), body) {
		t.Errorf("docs/rlqs.md does not show %s as it is", name)
	}
}
