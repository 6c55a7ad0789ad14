package deploy

import (
	"os"
	"strings"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
)

// TestRLQSFilter: the rate_limit_quota filter of docs/rlqs.md decodes as
// Envoy's own types and passes their validation, and docs/rlqs.md shows it
// as it is here. Every bucket's reporting_interval says what Envoy does
// (5 s, whatever it says), and neither the file nor the docs tell anyone to
// match it to --rlqs-interval, which Envoy would not honour.
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
	// Every bucket's settings, wherever the matcher tree holds them.
	settings := 0
	var walk func(protoreflect.Message)
	walk = func(pm protoreflect.Message) {
		if a, ok := pm.Interface().(*anypb.Any); ok {
			var bs rlqsv3.RateLimitQuotaBucketSettings
			if a.MessageIs(&bs) {
				if err := a.UnmarshalTo(&bs); err != nil {
					t.Fatal(err)
				}
				settings++
				if got := bs.GetReportingInterval().AsDuration(); got != 5*time.Second {
					t.Errorf("bucket settings %v: reporting_interval %v, want 5s (what Envoy's filter does)", bs.GetBucketIdBuilder(), got)
				}
				return
			}
			inner, err := a.UnmarshalNew()
			if err != nil {
				t.Fatal(err)
			}
			walk(inner.ProtoReflect())
			return
		}
		pm.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			switch {
			case fd.IsList() && fd.Message() != nil:
				for i := 0; i < v.List().Len(); i++ {
					walk(v.List().Get(i).Message())
				}
			case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
				walk(v.Message())
			}
			return true
		})
	}
	walk(cfg.ProtoReflect())
	if settings != 2 {
		t.Errorf("found %d bucket settings, want 2", settings)
	}
	// The page leaves out the file's leading comment.
	body := string(file)[strings.Index(string(file), "name: "):]
	if !strings.Contains(string(doc), body) {
		t.Errorf("docs/rlqs.md does not show %s as it is", name)
	}
	// What told users to match the filter's reporting_interval to
	// --rlqs-interval, which Envoy's filter does not honour.
	told := []string{"set the filter's `reporting_interval`", "reporting_interval should match", "set reporting_interval to",
		"match --rlqs-interval", "match `--rlqs-interval`", "set the filter's reporting_interval"}
	texts := map[string]string{name: string(file), "docs/rlqs.md": string(doc)}
	for _, f := range []string{"../README.md", "../internal/rlqs/flags.go", "../internal/rlqs/rlqs.go"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		texts[f] = string(b)
	}
	for what, text := range texts {
		for _, line := range strings.Split(text, "\n") {
			for _, phrase := range told {
				if strings.Contains(strings.ToLower(line), strings.ToLower(phrase)) {
					t.Errorf("%s tells to match the filter's reporting_interval: %q", what, strings.TrimSpace(line))
				}
			}
		}
	}
}
