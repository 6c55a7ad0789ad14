package deploy

import (
	"encoding/json"
	"os"
	"slices"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"gopkg.in/yaml.v3"
)

type validator interface{ ValidateAll() error }

// yamlToJSON decodes a YAML document into a generic value.
func readYAML(t *testing.T, path string) any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := yaml.Unmarshal(b, &v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return v
}

func decode(t *testing.T, name string, v any, m proto.Message) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if err := (protojson.UnmarshalOptions{}).Unmarshal(b, m); err != nil {
		t.Fatalf("%s: decoding as %s: %v", name, m.ProtoReflect().Descriptor().FullName(), err)
	}
}

// validateDeep validates m and every message packed in an Any inside it, at
// any depth: a message's own Validate does not look into its Anys.
func validateDeep(t *testing.T, name string, m proto.Message) int {
	t.Helper()
	n := 0
	if v, ok := m.(validator); ok {
		if err := v.ValidateAll(); err != nil {
			t.Errorf("%s: %s: %v", name, m.ProtoReflect().Descriptor().FullName(), err)
		}
		n++
	}
	var walk func(protoreflect.Message)
	walk = func(pm protoreflect.Message) {
		if a, ok := pm.Interface().(*anypb.Any); ok {
			inner, err := a.UnmarshalNew()
			if err != nil {
				t.Errorf("%s: unpacking %s: %v", name, a.GetTypeUrl(), err)
				return
			}
			n += validateDeep(t, name, inner)
			return
		}
		pm.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			switch {
			case fd.IsList() && fd.Message() != nil:
				for i := 0; i < v.List().Len(); i++ {
					walk(v.List().Get(i).Message())
				}
			case fd.IsMap() && fd.MapValue().Message() != nil:
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
					walk(mv.Message())
					return true
				})
			case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
				walk(v.Message())
			}
			return true
		})
	}
	walk(m.ProtoReflect())
	return n
}

func TestEnvoyBootstrap(t *testing.T) {
	var b bootstrapv3.Bootstrap
	decode(t, "envoy.yaml", readYAML(t, "envoy.yaml"), &b)
	// The bootstrap, the connection manager, the rate limit filter, the
	// router and the cluster's HTTP/2 options at least.
	if n := validateDeep(t, "envoy.yaml", &b); n < 5 {
		t.Errorf("validated %d messages, want at least 5", n)
	}
	var charon bool
	for _, c := range b.GetStaticResources().GetClusters() {
		if c.GetName() == "charon" {
			charon = len(c.GetTypedExtensionProtocolOptions()) > 0
		}
	}
	if !charon {
		t.Error("no charon cluster with HTTP/2 protocol options")
	}
	checkRemoteAddress(t, "envoy.yaml", &b)
}

// checkRemoteAddress: a connection manager whose routes limit by
// remote_address uses the peer's address (use_remote_address), or a
// client rotating X-Forwarded-For would get a fresh limit each time.
func checkRemoteAddress(t *testing.T, name string, b *bootstrapv3.Bootstrap) {
	t.Helper()
	n := 0
	for _, l := range b.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				var hcm hcmv3.HttpConnectionManager
				if !f.GetTypedConfig().MessageIs(&hcm) {
					continue
				}
				if err := f.GetTypedConfig().UnmarshalTo(&hcm); err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				var limits []*routev3.RateLimit
				for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
					limits = append(limits, vh.GetRateLimits()...)
					for _, r := range vh.GetRoutes() {
						limits = append(limits, r.GetRoute().GetRateLimits()...)
					}
				}
				byAddress := slices.ContainsFunc(limits, func(rl *routev3.RateLimit) bool {
					return slices.ContainsFunc(rl.GetActions(), func(a *routev3.RateLimit_Action) bool { return a.GetRemoteAddress() != nil })
				})
				if byAddress {
					n++
					if !hcm.GetUseRemoteAddress().GetValue() {
						t.Errorf("%s: listener %s limits by remote_address without use_remote_address: true", name, l.GetName())
					}
				}
			}
		}
	}
	if n == 0 {
		t.Errorf("%s: no route limits by remote_address", name)
	}
}

func TestIstioEnvoyFilter(t *testing.T) {
	doc, ok := readYAML(t, "istio-envoyfilter.yaml").(map[string]any)
	if !ok || doc["kind"] != "EnvoyFilter" || doc["apiVersion"] != "networking.istio.io/v1alpha3" {
		t.Fatalf("not a networking.istio.io/v1alpha3 EnvoyFilter: %v", doc["kind"])
	}
	spec, _ := doc["spec"].(map[string]any)
	patches, _ := spec["configPatches"].([]any)
	if len(patches) != 2 {
		t.Fatalf("%d configPatches, want 2", len(patches))
	}
	for i, p := range patches {
		pm, _ := p.(map[string]any)
		value, _ := pm["patch"].(map[string]any)["value"].(map[string]any)
		switch pm["applyTo"] {
		case "HTTP_FILTER":
			var f hcmv3.HttpFilter
			decode(t, "HTTP_FILTER patch", value, &f)
			if n := validateDeep(t, "HTTP_FILTER patch", &f); n < 2 {
				t.Errorf("patch %d: validated %d messages, want the filter and its typed_config", i, n)
			}
		case "HTTP_ROUTE":
			route, _ := value["route"].(map[string]any)
			rls, _ := route["rate_limits"].([]any)
			if len(rls) == 0 {
				t.Errorf("patch %d: no rate_limits", i)
			}
			for _, rl := range rls {
				var r routev3.RateLimit
				decode(t, "HTTP_ROUTE patch", rl, &r)
				validateDeep(t, "HTTP_ROUTE patch", &r)
			}
		default:
			t.Errorf("patch %d: unexpected applyTo %v", i, pm["applyTo"])
		}
	}
}
