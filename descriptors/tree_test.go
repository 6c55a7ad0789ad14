package descriptors

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/charonlimit/charon/tiers"
)

func pol(n int64) *tiers.Policy {
	return &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: n, Window: time.Second, Active: tiers.Unbounded}}}
}

func lim(n int64) *Limit { return &Limit{Policy: pol(n)} }

func named(n int64, name string, replaces ...string) *Limit {
	l := lim(n)
	l.Name, l.Replaces = name, replaces
	return l
}

func testTree(t *testing.T) *Tree {
	t.Helper()
	alice := pol(99)
	tr, err := NewTree([]DomainSpec{{
		Config: DomainConfig{Name: "rl"},
		Nodes: []*Node{
			{Key: "k", Limit: lim(1)},
			{Key: "k", Value: "v", Limit: lim(2)},
			{Key: "k", Value: "wi*", Limit: lim(3)},
			{Key: "k", Value: "w*", Limit: lim(4)},
			{Key: "k", Value: "free"},
			{Key: "mid", Value: "a*b*c", Limit: lim(5)},
			{Key: "files", Value: "files/*", ShareThreshold: true, Limit: lim(6)},
			{Key: "user", Limit: &Limit{Policy: pol(7), Overrides: map[string]*tiers.Policy{"alice": alice}}},
			{Key: "src", Value: "proxy", Children: []*Node{
				{Key: "dst", Limit: lim(8)},
				{Key: "dst", Value: "mock", Limit: lim(9), Children: []*Node{
					{Key: "method", Limit: lim(10)},
				}},
			}},
			{Key: "route", Value: "api/*", ShareThreshold: true, ValueToMetric: true, Children: []*Node{
				{Key: "method", Limit: lim(11)},
			}},
			{Key: "svc", Children: []*Node{
				{Key: "ep", Limit: &Limit{Policy: pol(12), DetailedMetric: true}},
			}},
			{Key: "tenant", ValueToMetric: true, Children: []*Node{
				{Key: "user", Limit: lim(13)},
			}},
			{Key: "a", Limit: named(14, "a_limit")},
			{Key: "b", Limit: named(15, "b_limit", "a_limit")},
		},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func e(kv ...string) []Entry {
	var out []Entry
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

func TestMatch(t *testing.T) {
	tr := testTree(t)
	tests := []struct {
		name     string
		entries  []Entry
		limit    int64 // 0: not limited
		resource string
		domain   string
		metric   string
	}{
		{"exact beats wildcard and key", e("k", "v"), 2, "rl/k=v", "", "rl.k_v"},
		{"first wildcard in config order", e("k", "wild"), 3, "rl/k=wi*", "wild", "rl.k_wi*"},
		{"second wildcard", e("k", "wow"), 4, "rl/k=w*", "wow", "rl.k_w*"},
		{"key-only fallback", e("k", "other"), 1, "rl/k", "other", "rl.k"},
		{"exact value without limit whitelists", e("k", "free"), 0, "", "", ""},
		{"mid wildcard", e("mid", "aXXbYYc"), 5, "rl/mid=a*b*c", "aXXbYYc", "rl.mid_a*b*c"},
		{"mid wildcard no match", e("mid", "aXXcYYb"), 0, "", "", ""},
		{"share_threshold shares one domain", e("files", "files/a.pdf"), 6, "rl/files=files%2F*", "", "rl.files_files/*"},
		{"share_threshold other value same domain", e("files", "files/b.csv"), 6, "rl/files=files%2F*", "", "rl.files_files/*"},
		{"nested key-only", e("src", "proxy", "dst", "x"), 8, "rl/src=proxy/dst", "x", "rl.src_proxy.dst"},
		{"nested exact", e("src", "proxy", "dst", "mock"), 9, "rl/src=proxy/dst=mock", "", "rl.src_proxy.dst_mock"},
		{"deeper", e("src", "proxy", "dst", "mock", "method", "GET"), 10, "rl/src=proxy/dst=mock/method", "GET", "rl.src_proxy.dst_mock.method"},
		{"stops at node without limit", e("src", "proxy"), 0, "", "", ""},
		{"more entries than tree", e("k", "v", "x", "y"), 0, "", "", ""},
		{"more entries than path", e("user", "bob", "x", "y"), 0, "", "", ""},
		{"unknown key", e("nope", "v"), 0, "", "", ""},
		{"share wildcard with value_to_metric keeps pattern", e("route", "api/x", "method", "GET"), 11, "rl/route=api%2F*/method", "GET", "rl.route_api/*.method"},
		{"detailed_metric leaf", e("svc", "s1", "ep", "e1"), 12, "rl/svc/ep", "s1,e1", "rl.svc_s1.ep_e1"},
		{"value_to_metric intermediate", e("tenant", "t1", "user", "u1"), 13, "rl/tenant/user", "t1,u1", "rl.tenant_t1.user"},
		{"escaping", e("user", "a/b,c%"), 7, "rl/user", "a%2Fb%2Cc%25", "rl.user"},
		{"empty value to key-only", e("user", ""), 7, "rl/user", "", "rl.user"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, ok := tr.Match("rl", tt.entries)
			if ok != (tt.limit != 0) {
				t.Fatalf("ok = %v, want %v", ok, tt.limit != 0)
			}
			if !ok {
				return
			}
			if got := m.Policy.Tiers[0].Limit; got != tt.limit {
				t.Errorf("limit = %d, want %d", got, tt.limit)
			}
			if m.Resource != tt.resource || m.Domain != tt.domain || m.MetricKey != tt.metric {
				t.Errorf("got (%q, %q, %q), want (%q, %q, %q)", m.Resource, m.Domain, m.MetricKey, tt.resource, tt.domain, tt.metric)
			}
		})
	}
}

func TestMatchOverride(t *testing.T) {
	tr := testTree(t)
	m, _ := tr.Match("rl", e("user", "alice"))
	if m.Policy.Tiers[0].Limit != 99 {
		t.Errorf("alice: limit %d, want override 99", m.Policy.Tiers[0].Limit)
	}
	if m.Limit.Policy.Tiers[0].Limit != 7 {
		t.Errorf("Limit.Policy changed")
	}
	m, _ = tr.Match("rl", e("user", "bob"))
	if m.Policy.Tiers[0].Limit != 7 {
		t.Errorf("bob: limit %d, want default 7", m.Policy.Tiers[0].Limit)
	}
}

func TestMatchUnknownDomainAndNil(t *testing.T) {
	tr := testTree(t)
	if _, ok := tr.Match("other", e("k", "v")); ok {
		t.Error("unknown domain matched")
	}
	if _, ok := tr.Match("rl", nil); ok {
		t.Error("empty descriptor matched")
	}
	var nilTree *Tree
	if _, ok := nilTree.Match("rl", e("k", "v")); ok {
		t.Error("nil tree matched")
	}
	if _, ok := nilTree.Domain("rl"); ok {
		t.Error("nil tree has a domain")
	}
}

func TestApplyReplaces(t *testing.T) {
	tr := testTree(t)
	a, _ := tr.Match("rl", e("a", "1"))
	b, _ := tr.Match("rl", e("b", "1"))
	k, _ := tr.Match("rl", e("k", "v"))
	ms := []Match{a, b, k}
	ApplyReplaces(ms)
	if !ms[0].Replaced || ms[1].Replaced || ms[2].Replaced {
		t.Errorf("replaced = %v %v %v, want true false false", ms[0].Replaced, ms[1].Replaced, ms[2].Replaced)
	}
	ms = []Match{a, k}
	ApplyReplaces(ms)
	if ms[0].Replaced {
		t.Error("a replaced without b in the request")
	}
}

func TestIdentityBounded(t *testing.T) {
	tr := testTree(t)
	long := strings.Repeat("x", 1000)
	m, ok := tr.Match("rl", e("user", long))
	if !ok {
		t.Fatal("no match")
	}
	if len(m.Domain) != MaxKeyLen || m.Domain[MaxKeyLen-17] != '~' {
		t.Errorf("domain %q not bounded", m.Domain)
	}
	m2, _ := tr.Match("rl", e("user", long+"y"))
	if m.Domain == m2.Domain {
		t.Error("long domains differing in the tail collide")
	}
	m3, _ := tr.Match("rl", e("user", long))
	if m.Domain != m3.Domain {
		t.Error("bounded domain not stable")
	}
}

func TestIDStable(t *testing.T) {
	a := PolicyID(pol(5), map[string]*tiers.Policy{"x": pol(1), "y": pol(2)}, nil)
	b := PolicyID(pol(5), map[string]*tiers.Policy{"y": pol(2), "x": pol(1)}, nil)
	if a != b {
		t.Error("ID depends on map order")
	}
	if a == PolicyID(pol(6), map[string]*tiers.Policy{"x": pol(1), "y": pol(2)}, nil) {
		t.Error("ID ignores the policy")
	}
	if PolicyID(nil, nil, &Copies{DomainLimit: 1}) == PolicyID(nil, nil, &Copies{DomainLimit: 2}) {
		t.Error("ID ignores copies")
	}
	tr1, tr2 := testTree(t), testTree(t)
	m1, _ := tr1.Match("rl", e("k", "v"))
	m2, _ := tr2.Match("rl", e("k", "v"))
	if m1.Limit.ID != m2.Limit.ID || m1.Limit.ID == 0 {
		t.Errorf("IDs across builds: %x %x", m1.Limit.ID, m2.Limit.ID)
	}
}

func TestNewTreeErrors(t *testing.T) {
	_, err := NewTree([]DomainSpec{
		{Config: DomainConfig{Name: "d"}, Nodes: []*Node{{Key: "k", Value: "v"}, {Key: "k", Value: "v"}, {Value: "x"}}},
		{Config: DomainConfig{Name: "d"}},
		{Config: DomainConfig{}},
	})
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("err = %v, want ErrInvalid", err)
	}
	for _, want := range []string{"given twice", "empty key", "duplicate domain", "empty domain"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

func TestLeaves(t *testing.T) {
	tr := testTree(t)
	ls := tr.Leaves("rl")
	if len(ls) != 15 {
		t.Fatalf("%d leaves, want 15", len(ls))
	}
	for i := 1; i < len(ls); i++ {
		if ls[i-1].Resource > ls[i].Resource {
			t.Errorf("leaves not sorted: %q > %q", ls[i-1].Resource, ls[i].Resource)
		}
	}
	if got := tr.Domains(); len(got) != 1 || got[0].Name != "rl" {
		t.Errorf("Domains() = %v", got)
	}
}

// bigTree has 1,000 leaves: 100 services × (5 fixed methods + 5 user-level
// leaves under them).
func bigTree(tb testing.TB) *Tree {
	var nodes []*Node
	for s := 0; s < 100; s++ {
		svc := &Node{Key: "service", Value: fmt.Sprintf("svc%d", s)}
		for m := 0; m < 5; m++ {
			svc.Children = append(svc.Children, &Node{Key: "method", Value: fmt.Sprintf("m%d", m), Limit: lim(10),
				Children: []*Node{{Key: "user", Limit: lim(5)}}})
		}
		nodes = append(nodes, svc)
	}
	tr, err := NewTree([]DomainSpec{{Config: DomainConfig{Name: "api"}, Nodes: nodes}})
	if err != nil {
		tb.Fatal(err)
	}
	return tr
}

func BenchmarkMatch3(b *testing.B) {
	benchMatch(b,
		e("service", "svc42", "method", "m3"),
		e("service", "svc7", "method", "m1", "user", "alice"),
		e("service", "svc99", "method", "m4", "user", "bob"))
}

func BenchmarkMatch3Escaped(b *testing.B) {
	benchMatch(b,
		e("service", "svc42", "method", "m3", "user", "a/b"),
		e("service", "svc7", "method", "m1", "user", "alice:1"),
		e("service", "svc99", "method", "m4", "user", "bob{x}"))
}

// benchMatch matches each of reqs in bigTree, each round.
func benchMatch(b *testing.B, reqs ...[]Entry) {
	tr := bigTree(b)
	b.ReportAllocs()
	for b.Loop() {
		for _, r := range reqs {
			if _, ok := tr.Match("api", r); !ok {
				b.Fatal("no match")
			}
		}
	}
}

func TestMatchAllocs(t *testing.T) {
	tr := bigTree(t)
	r := e("service", "svc7", "method", "m1", "user", "a/b")
	if n := testing.AllocsPerRun(100, func() { tr.Match("api", r) }); n > 1 {
		t.Errorf("Match allocates %v times, want <= 1", n)
	}
	r = e("service", "svc7", "method", "m1", "user", "alice")
	if n := testing.AllocsPerRun(100, func() { tr.Match("api", r) }); n != 0 {
		t.Errorf("Match allocates %v times for a plain value, want 0", n)
	}
}

// TestMetricKeyDetailed checks MetricKey against envoyproxy/ratelimit's
// GetLimit: detailed_metric acts only through the matched leaf's limit (on a
// parent it does nothing, even with a limit of its own), and then writes
// "_" and the request value at every level, an empty one included, unless a
// level of the path has share_threshold: that level writes its pattern and
// the others "_" and the value only when it is not empty.
func TestMetricKeyDetailed(t *testing.T) {
	detailed := func(n int64) *Limit { return &Limit{Policy: pol(n), DetailedMetric: true} }
	// As config builds a node: Node.DetailedMetric and, with a limit,
	// Limit.DetailedMetric.
	tr, err := NewTree([]DomainSpec{{
		Config: DomainConfig{Name: "d"},
		Nodes: []*Node{
			{Key: "user", DetailedMetric: true, Children: []*Node{{Key: "path", Limit: lim(1)}}},
			{Key: "owner", DetailedMetric: true, Limit: detailed(2), Children: []*Node{{Key: "path", Limit: lim(3)}}},
			{Key: "k", Value: "v", Children: []*Node{{Key: "path", DetailedMetric: true, Limit: detailed(4)}}},
			{Key: "f", Value: "a*", DetailedMetric: true, Limit: detailed(5)},
			{Key: "s", Value: "x*", ShareThreshold: true, Children: []*Node{
				{Key: "u", DetailedMetric: true, Limit: detailed(6)},
				{Key: "m", Value: "GET", DetailedMetric: true, Limit: detailed(7)},
			}},
			{Key: "vt", ValueToMetric: true, Children: []*Node{{Key: "leaf", DetailedMetric: true, Limit: detailed(8)}}},
			{Key: "t", ValueToMetric: true, Limit: lim(9)},
			{Key: "w", Value: "*", ValueToMetric: true, Children: []*Node{{Key: "leaf", Limit: lim(10)}}},
			{Key: "g", Value: "p*", DetailedMetric: true, Children: []*Node{{Key: "leaf", Limit: lim(11)}}},
		},
	}})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		entries []Entry
		limit   int64
		metric  string
	}{
		{"parent detailed without limit", e("user", "alice", "path", "/x"), 1, "d.user.path"},
		{"parent detailed with its own limit, deeper request", e("owner", "bob", "path", "/x"), 3, "d.owner.path"},
		{"parent detailed with its own limit, request ends there", e("owner", "bob"), 2, "d.owner_bob"},
		{"detailed leaf", e("k", "v", "path", "/x"), 4, "d.k_v.path_/x"},
		{"detailed leaf, empty value", e("k", "v", "path", ""), 4, "d.k_v.path_"},
		{"detailed wildcard leaf", e("f", "abc"), 5, "d.f_abc"},
		{"detailed with share_threshold", e("s", "xy", "u", "bob"), 6, "d.s_x*.u_bob"},
		{"detailed with share_threshold, empty value", e("s", "xy", "u", ""), 6, "d.s_x*.u"},
		{"detailed with share_threshold, fixed leaf", e("s", "xz", "m", "GET"), 7, "d.s_x*.m_GET"},
		{"detailed overrides value_to_metric", e("vt", "a", "leaf", "b"), 8, "d.vt_a.leaf_b"},
		{"detailed, empty values everywhere", e("vt", "", "leaf", ""), 8, "d.vt_.leaf_"},
		{"value_to_metric", e("t", "a"), 9, "d.t_a"},
		{"value_to_metric, empty value", e("t", ""), 9, "d.t"},
		{"value_to_metric wildcard, empty value", e("w", "", "leaf", "z"), 10, "d.w.leaf"},
		{"parent wildcard detailed without limit keeps its pattern", e("g", "pq", "leaf", "z"), 11, "d.g_p*.leaf"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, ok := tr.Match("d", tt.entries)
			if !ok {
				t.Fatal("no match")
			}
			if got := m.Policy.Tiers[0].Limit; got != tt.limit {
				t.Errorf("limit = %d, want %d", got, tt.limit)
			}
			if m.MetricKey != tt.metric {
				t.Errorf("MetricKey = %q, want %q", m.MetricKey, tt.metric)
			}
		})
	}
}
