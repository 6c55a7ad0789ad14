package xdsconfig

import (
	"strings"
	"testing"
	"testing/fstest"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/charonlimit/charon/config"
)

func anyOf(t *testing.T, m proto.Message) *anypb.Any {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// withNewer returns d with quota_mode and metadata set as
// envoyproxy/ratelimit's newer RateLimitDescriptor encodes them.
func withNewer(t *testing.T, d *rlsconfv3.RateLimitDescriptor, quota bool, meta map[string]any) *rlsconfv3.RateLimitDescriptor {
	t.Helper()
	var b []byte
	if quota {
		b = protowire.AppendTag(b, fieldQuotaMode, protowire.VarintType)
		b = protowire.AppendVarint(b, 1)
	}
	if meta != nil {
		s, err := structpb.NewStruct(meta)
		if err != nil {
			t.Fatal(err)
		}
		m, err := proto.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		b = protowire.AppendTag(b, fieldMetadata, protowire.BytesType)
		b = protowire.AppendBytes(b, m)
	}
	d.ProtoReflect().SetUnknown(b)
	return d
}

func TestDecode(t *testing.T) {
	limit := func(u rlsconfv3.RateLimitUnit, n uint32) *rlsconfv3.RateLimitPolicy {
		return &rlsconfv3.RateLimitPolicy{Unit: u, RequestsPerUnit: n}
	}
	for _, tc := range []struct {
		name string
		cfg  *rlsconfv3.RateLimitConfig
		want string
	}{
		{"every field", &rlsconfv3.RateLimitConfig{Name: "edge", Domain: "edge_proxy", Descriptors: []*rlsconfv3.RateLimitDescriptor{
			{Key: "remote_address", RateLimit: limit(rlsconfv3.RateLimitUnit_SECOND, 10), ShadowMode: true, DetailedMetric: true},
			{Key: "path", Value: "/login", Descriptors: []*rlsconfv3.RateLimitDescriptor{
				{Key: "user", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: unitWeek, RequestsPerUnit: 5, Name: "strict",
					Replaces: []*rlsconfv3.RateLimitReplace{{Name: "loose"}}}},
			}},
		}}, `domain: edge_proxy
descriptors:
    - key: remote_address
      rate_limit:
        unit: SECOND
        requests_per_unit: 10
      shadow_mode: true
      detailed_metric: true
    - key: path
      value: /login
      descriptors:
        - key: user
          rate_limit:
            unit: WEEK
            requests_per_unit: 5
            name: strict
            replaces:
                - name: loose
`},
		{"MONTH and YEAR of the newer proto", &rlsconfv3.RateLimitConfig{Name: "b", Domain: "d", Descriptors: []*rlsconfv3.RateLimitDescriptor{
			{Key: "a", RateLimit: limit(unitMonth, 1000)},
			{Key: "b", RateLimit: limit(unitYear, 9000)},
		}}, `domain: d
descriptors:
    - key: a
      rate_limit:
        unit: MONTH
        requests_per_unit: 1000
    - key: b
      rate_limit:
        unit: YEAR
        requests_per_unit: 9000
`},
		{"unlimited has no unit, a zero limit is kept", &rlsconfv3.RateLimitConfig{Name: "u", Domain: "d", Descriptors: []*rlsconfv3.RateLimitDescriptor{
			{Key: "a", RateLimit: &rlsconfv3.RateLimitPolicy{Unlimited: true}},
			{Key: "b", RateLimit: limit(rlsconfv3.RateLimitUnit_MINUTE, 0)},
		}}, `domain: d
descriptors:
    - key: a
      rate_limit:
        unlimited: true
    - key: b
      rate_limit:
        unit: MINUTE
        requests_per_unit: 0
`},
		{"quota_mode and metadata of the newer proto", &rlsconfv3.RateLimitConfig{Name: "q", Domain: "d", Descriptors: []*rlsconfv3.RateLimitDescriptor{
			withNewer(t, &rlsconfv3.RateLimitDescriptor{Key: "a", RateLimit: limit(rlsconfv3.RateLimitUnit_HOUR, 3)}, true, map[string]any{"team": "yes", "n": 429}),
		}}, `domain: d
descriptors:
    - key: a
      rate_limit:
        unit: HOUR
        requests_per_unit: 3
      quota_mode: true
      metadata:
        "n": 429
        team: "yes"
`},
	} {
		r, err := Decode([]*anypb.Any{anyOf(t, tc.cfg)})
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		got, err := r.Files.(config.Files).ReadFile(r.Names[0])
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(tc.want, string(got)); d != "" {
			t.Errorf("%s: YAML (-want +got):\n%s", tc.name, d)
		}
		// The files load as a directory of them would.
		if _, _, err := config.Load(r.Files, config.Options{}); err != nil {
			t.Errorf("%s: loading: %v", tc.name, err)
		}
		dir := fstest.MapFS{r.Names[0]: {Data: got}}
		if err := fstest.TestFS(r.Files, r.Names[0]); err != nil {
			t.Errorf("%s: the files are not a well-behaved fs.FS: %v", tc.name, err)
		}
		if _, _, err := config.Load(dir, config.Options{}); err != nil {
			t.Errorf("%s: loading from a directory: %v", tc.name, err)
		}
	}
}

// TestDecodeNothing: a response with no resource is a configuration with
// no domain.
func TestDecodeNothing(t *testing.T) {
	r, err := Decode(nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg, _, err := config.Load(r.Files, config.Options{})
	if err != nil || cfg == nil || len(cfg.Files) != 0 {
		t.Errorf("no resources: %v, %v", cfg, err)
	}
}

func TestDecodeRefuses(t *testing.T) {
	unknown := &rlsconfv3.RateLimitDescriptor{Key: "a"}
	unknown.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 9, protowire.VarintType), 1))
	for _, tc := range []struct {
		name string
		res  []*anypb.Any
		want string
	}{
		{"another type", []*anypb.Any{anyOf(t, structpb.NewStringValue("x"))}, "resources[0]: type type.googleapis.com/google.protobuf.Value"},
		{"a field not known", []*anypb.Any{anyOf(t, &rlsconfv3.RateLimitConfig{Name: "n", Domain: "d",
			Descriptors: []*rlsconfv3.RateLimitDescriptor{unknown}})}, `resource "n" (domain "d"): descriptors[0]: field 9 is not known`},
		{"a name twice", []*anypb.Any{anyOf(t, &rlsconfv3.RateLimitConfig{Name: "n", Domain: "a"}), anyOf(t, &rlsconfv3.RateLimitConfig{Name: "n", Domain: "b"})},
			`resource "n": resources[0] and [1] have the same name`},
	} {
		if _, err := Decode(tc.res); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}

func TestFileName(t *testing.T) {
	for _, tc := range []struct {
		name string
		i    int
		want string
	}{
		{"edge", 0, "edge"}, {"", 3, "resources[3]"}, {"a/b", 0, "a%2Fb"}, {".hidden", 0, "%2Ehidden"}, {"50%", 0, "50%25"},
	} {
		if got := FileName(tc.name, tc.i); got != tc.want {
			t.Errorf("FileName(%q, %d) = %q, want %q", tc.name, tc.i, got, tc.want)
		}
	}
}

// TestExplain: the problems of a load name the resource, its domain and
// the descriptor by its keys, not lines of the YAML written for it.
func TestExplain(t *testing.T) {
	r, err := Decode([]*anypb.Any{
		anyOf(t, &rlsconfv3.RateLimitConfig{Name: "good", Domain: "ok", Descriptors: []*rlsconfv3.RateLimitDescriptor{
			{Key: "k", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_SECOND, RequestsPerUnit: 1}}}}),
		anyOf(t, &rlsconfv3.RateLimitConfig{Name: "bad", Domain: "edge", Descriptors: []*rlsconfv3.RateLimitDescriptor{
			{Key: "path", Value: "/login", Descriptors: []*rlsconfv3.RateLimitDescriptor{
				{Key: "user", RateLimit: &rlsconfv3.RateLimitPolicy{RequestsPerUnit: 5}},
			}}}}),
	})
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = config.Load(r.Files, config.Options{})
	if err == nil {
		t.Fatal("a limit without a unit loaded")
	}
	got := r.Explain(err)
	want := `resource "bad" (domain "edge"): descriptors[0]{path=/login}.descriptors[0]{user}.rate_limit`
	if !strings.HasPrefix(got, want) || strings.Contains(got, "bad:") {
		t.Errorf("Explain:\n%s\nwant it to start with\n%s", got, want)
	}
}

// TestHashResources: the same resources in any order are the same
// configuration; others are not.
func TestHashResources(t *testing.T) {
	a := anyOf(t, &rlsconfv3.RateLimitConfig{Name: "a", Domain: "a"})
	b := anyOf(t, &rlsconfv3.RateLimitConfig{Name: "b", Domain: "b"})
	if hashResources([]*anypb.Any{a, b}) != hashResources([]*anypb.Any{b, a}) {
		t.Error("the order of the resources changes the hash")
	}
	if hashResources([]*anypb.Any{a, b}) == hashResources([]*anypb.Any{a}) || hashResources([]*anypb.Any{a, a}) == hashResources([]*anypb.Any{a}) {
		t.Error("different resources hash alike")
	}
}
