package deploy

import (
	"regexp"
	"strings"
	"testing"

	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"gopkg.in/yaml.v3"
)

// TestDocsAccessLog: the access log of docs/operations.md's "Who is being
// limited" is a valid connection manager access_log whose format reads
// Charon's attribution from the rate limit filter's dynamic metadata.
func TestDocsAccessLog(t *testing.T) {
	doc := string(readFile(t, "../docs/operations.md"))
	_, section, ok := strings.Cut(doc, "## Who is being limited\n")
	if !ok {
		t.Fatal("docs/operations.md has no section \"Who is being limited\"")
	}
	block := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindStringSubmatch(section)
	if block == nil {
		t.Fatal("no yaml block in the section")
	}
	var v any
	if err := yaml.Unmarshal([]byte(block[1]), &v); err != nil {
		t.Fatal(err)
	}
	var hcm hcmv3.HttpConnectionManager
	decode(t, "docs access_log", v, &hcm)
	if len(hcm.GetAccessLog()) == 0 {
		t.Fatal("no access_log")
	}
	validateDeep(t, "docs access_log", hcm.GetAccessLog()[0])
	for _, field := range []string{"rule", "name", "tier", "retry_after"} {
		if want := "%DYNAMIC_METADATA(envoy.filters.http.ratelimit:charon:" + field + ")%"; !strings.Contains(block[1], want) {
			t.Errorf("the access log does not read %s", want)
		}
	}
}
