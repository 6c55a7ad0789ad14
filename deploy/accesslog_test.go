package deploy

import (
	"regexp"
	"strings"
	"testing"

	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"gopkg.in/yaml.v3"
)

// TestREADMEAccessLog: the access log of the README's "Who is being
// limited" is a valid connection manager access_log whose format reads
// Charon's attribution from the rate limit filter's dynamic metadata.
func TestREADMEAccessLog(t *testing.T) {
	readme := string(readFile(t, "../README.md"))
	_, section, ok := strings.Cut(readme, "## Who is being limited\n")
	if !ok {
		t.Fatal("README.md has no section \"Who is being limited\"")
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
	decode(t, "README access_log", v, &hcm)
	if len(hcm.GetAccessLog()) == 0 {
		t.Fatal("no access_log")
	}
	validateDeep(t, "README access_log", hcm.GetAccessLog()[0])
	for _, field := range []string{"rule", "name", "tier", "retry_after"} {
		if want := "%DYNAMIC_METADATA(envoy.filters.http.ratelimit:charon:" + field + ")%"; !strings.Contains(block[1], want) {
			t.Errorf("the access log does not read %s", want)
		}
	}
}
