package descriptors

import (
	"slices"
	"strings"
	"testing"
)

// TestParseResource: every leaf's path is read back from its resource,
// escaped bytes included; a bounded or foreign resource is refused.
func TestParseResource(t *testing.T) {
	tr, err := NewTree([]DomainSpec{{Config: DomainConfig{Name: "r/l"}, Nodes: []*Node{
		{Key: "path", Value: "/login", Children: []*Node{{Key: "remote address", Limit: lim(1)}}},
		{Key: "file", Value: "img/*", Limit: lim(2)},
		{Key: "k=v", Value: "%,:{}~\"\\é", Limit: lim(3)},
		{Key: "long", Value: strings.Repeat("x", 300), Limit: lim(4)},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, lf := range tr.Leaves("r/l") {
		got, ok := ParseResource("r/l", lf.Resource)
		if bounded := len(lf.Resource) == MaxKeyLen; ok == bounded {
			t.Errorf("ParseResource(%q): ok %v, want %v", lf.Resource, ok, !bounded)
		}
		if ok && !slices.Equal(got, lf.Path) {
			t.Errorf("ParseResource(%q) = %q, want %q", lf.Resource, got, lf.Path)
		}
	}
	for _, bad := range []string{"other/k", "r%2Fl/", "r%2Fl/k=%4", "r%2Fl/k=%zz", "r%2Fl/=v"} {
		if p, ok := ParseResource("r/l", bad); ok {
			t.Errorf("ParseResource(%q) = %q, want refused", bad, p)
		}
	}
}
