package descriptors

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// ErrInvalid is matched (errors.Is) by every error NewTree returns.
var ErrInvalid = errors.New("descriptors: invalid tree")

// Node is one descriptor of the configuration, the input of NewTree.
// Value "" makes a key-only node (each request value its own Charon domain);
// a Value holding "*" is a wildcard, each "*" matching any run of bytes.
type Node struct {
	Key, Value string
	// ShareThreshold makes every value matched by a wildcard or key-only
	// node share one limit (the node adds nothing to Match.Domain).
	ShareThreshold bool
	// ValueToMetric puts this level's request value in MetricKey.
	ValueToMetric bool
	// DetailedMetric is recorded but changes nothing: as in
	// envoyproxy/ratelimit, only the matched leaf's Limit.DetailedMetric
	// does (on a parent it is ignored).
	DetailedMetric bool
	// Limit is the node's limit; nil: a request ending here is not limited.
	Limit    *Limit
	Children []*Node
}

// DomainSpec is one RLS domain for NewTree.
type DomainSpec struct {
	Config DomainConfig
	Nodes  []*Node
}

// Leaf is a node of a Tree that carries a limit, as Tree.Leaves lists it.
type Leaf struct {
	// Domain is the RLS domain; Path the configured keys and values
	// (Value "" for key-only, the pattern for wildcards).
	Domain   string
	Path     []Entry
	Resource string
	Limit    *Limit
}

// Tree is the immutable, matched-against descriptor tree of every RLS domain.
// Safe for concurrent use; a nil *Tree matches nothing.
type Tree struct {
	domains map[string]*domainTree
	names   []string
}

type domainTree struct {
	cfg      DomainConfig
	root     level
	maxDepth int
	leaves   []Leaf
}

type level struct {
	byKey map[string]*keyGroup // nil: no children
}

type keyGroup struct {
	exact   map[string]*node
	wild    []*node // config order: the first that matches wins
	keyOnly *node
}

const (
	kindExact uint8 = iota
	kindWild
	kindKeyOnly
)

type node struct {
	kind     uint8
	share    bool
	key      string
	value    string
	parts    []string // wildcard: Value split at "*"
	limit    *Limit
	children level

	// valueToMetric is Node.ValueToMetric (Node.DetailedMetric is not
	// kept: only the leaf's Limit.DetailedMetric counts).
	valueToMetric bool

	// Precomputed for nodes with a limit.
	path      []*node // root..this
	resource  string
	metric    string // MetricKey when !metricDyn
	metricDyn bool
	nvars     int // levels adding a request value to Domain
	lastVar   int // the level of the last such value

	// detailedShared: the limit has detailed_metric and a level of the
	// path has share_threshold, which changes how MetricKey is written.
	detailedShared bool
}

// NewTree builds the tree of domains. It computes Limit.ID, Shape and
// QuotaID where they are 0 and
// refuses an empty or repeated domain, an empty key, and a key and value
// given twice at one level.
func NewTree(domains []DomainSpec) (*Tree, error) {
	t := &Tree{domains: make(map[string]*domainTree, len(domains))}
	var errs []error
	for _, ds := range domains {
		name := ds.Config.Name
		if name == "" {
			errs = append(errs, fmt.Errorf("%w: empty domain", ErrInvalid))
			continue
		}
		if _, dup := t.domains[name]; dup {
			errs = append(errs, fmt.Errorf("%w: duplicate domain %q", ErrInvalid, name))
			continue
		}
		d := &domainTree{cfg: ds.Config}
		b := builder{d: d, errs: &errs}
		b.level(&d.root, ds.Nodes, nil, Escape(name))
		slices.SortFunc(d.leaves, func(a, b Leaf) int { return strings.Compare(a.Resource, b.Resource) })
		t.domains[name] = d
		t.names = append(t.names, name)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	slices.Sort(t.names)
	return t, nil
}

type builder struct {
	d    *domainTree
	errs *[]error
}

func (b *builder) level(lv *level, nodes []*Node, parent []*node, resource string) {
	if len(nodes) == 0 {
		return
	}
	lv.byKey = make(map[string]*keyGroup)
	for _, in := range nodes {
		if in.Key == "" {
			*b.errs = append(*b.errs, fmt.Errorf("%w: %s: empty key", ErrInvalid, resource))
			continue
		}
		g := lv.byKey[in.Key]
		if g == nil {
			g = &keyGroup{}
			lv.byKey[in.Key] = g
		}
		n := &node{key: in.Key, value: in.Value, share: in.ShareThreshold,
			valueToMetric: in.ValueToMetric, limit: in.Limit}
		res := resource + "/" + Escape(in.Key)
		dup := false
		switch {
		case in.Value == "":
			n.kind = kindKeyOnly
			dup = g.keyOnly != nil
			if !dup {
				g.keyOnly = n
			}
		case strings.Contains(in.Value, "*"):
			n.kind = kindWild
			n.parts = strings.Split(in.Value, "*")
			for _, w := range g.wild {
				dup = dup || w.value == in.Value
			}
			if !dup {
				g.wild = append(g.wild, n)
			}
			res += "=" + Escape(in.Value)
		default:
			n.kind = kindExact
			if g.exact == nil {
				g.exact = make(map[string]*node)
			}
			_, dup = g.exact[in.Value]
			if !dup {
				g.exact[in.Value] = n
			}
			res += "=" + Escape(in.Value)
		}
		if dup {
			*b.errs = append(*b.errs, fmt.Errorf("%w: %s: key %q value %q given twice", ErrInvalid, resource, in.Key, in.Value))
			continue
		}
		n.path = append(slices.Clip(parent), n)
		if len(n.path) > b.d.maxDepth && n.limit != nil {
			b.d.maxDepth = len(n.path)
		}
		if n.limit != nil {
			b.leaf(n, Bound(res))
		}
		b.level(&n.children, in.Children, n.path, res)
	}
}

func (b *builder) leaf(n *node, resource string) {
	l := n.limit
	if l.ID == 0 {
		l.ID = PolicyID(l.Policy, l.Overrides, l.Copies)
	}
	if l.Quota != nil && l.QuotaID == 0 {
		l.QuotaID = l.Quota.Shape()
	}
	if l.Policy != nil && l.Shape == 0 {
		l.Shape = l.Policy.Shape()
	}
	if len(l.Overrides) > 0 && l.OverrideShapes == nil {
		shapes := make(map[string]uint64, len(l.Overrides))
		for d, p := range l.Overrides {
			shapes[d] = p.Shape()
		}
		l.OverrideShapes = shapes
	}
	n.resource = resource
	metric := b.d.cfg.Name
	leaf := Leaf{Domain: b.d.cfg.Name, Resource: resource, Limit: l}
	for i, p := range n.path {
		leaf.Path = append(leaf.Path, Entry{Key: p.key, Value: p.value})
		if p.kind != kindExact && !p.share {
			n.nvars++
			n.lastVar = i
		}
		if p.kind != kindExact && !p.share && (p.valueToMetric || l.DetailedMetric) {
			n.metricDyn = true
		}
		if p.shared() && l.DetailedMetric {
			n.detailedShared = true
		}
		metric += "." + p.key
		if p.kind != kindKeyOnly {
			metric += "_" + p.value
		}
	}
	if !n.metricDyn {
		n.metric = metric
	}
	b.d.leaves = append(b.d.leaves, leaf)
}

// matches reports whether v matches the wildcard pattern of n.
func (n *node) matches(v string) bool {
	parts := n.parts
	first, last := parts[0], parts[len(parts)-1]
	if len(v) < len(first)+len(last) || !strings.HasPrefix(v, first) || !strings.HasSuffix(v, last) {
		return false
	}
	v = v[len(first) : len(v)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(v, p)
		if i < 0 {
			return false
		}
		v = v[i+len(p):]
	}
	return true
}

// Domain returns the configuration of the RLS domain name.
func (t *Tree) Domain(name string) (*DomainConfig, bool) {
	if t == nil {
		return nil, false
	}
	d := t.domains[name]
	if d == nil {
		return nil, false
	}
	return &d.cfg, true
}

// Domains lists the RLS domains, sorted by name.
func (t *Tree) Domains() []DomainConfig {
	if t == nil {
		return nil
	}
	out := make([]DomainConfig, 0, len(t.names))
	for _, n := range t.names {
		out = append(out, t.domains[n].cfg)
	}
	return out
}

// HasCopies reports whether any leaf of any domain is a copy-limited
// resource.
func (t *Tree) HasCopies() bool {
	if t == nil {
		return false
	}
	for _, d := range t.domains {
		for _, l := range d.leaves {
			if l.Limit != nil && l.Limit.Copies != nil {
				return true
			}
		}
	}
	return false
}

// Leaves lists the leaves of the RLS domain, sorted by Resource. The caller
// must not change them.
func (t *Tree) Leaves(domain string) []Leaf {
	if t == nil || t.domains[domain] == nil {
		return nil
	}
	return t.domains[domain].leaves
}

// Match matches one request descriptor of the RLS domain with
// envoyproxy/ratelimit's rule: at each level the entry's key and exact value
// first, then the wildcards in config order, then the key alone; the limit is
// that of the node reached by the last entry, so a descriptor with more
// entries than the path to a limit, or one that stops at a node without a
// limit, is not limited. ok is false when it matches no leaf with a limit.
func (t *Tree) Match(domain string, entries []Entry) (m Match, ok bool) {
	if t == nil || len(entries) == 0 {
		return Match{}, false
	}
	d := t.domains[domain]
	if d == nil || len(entries) > d.maxDepth {
		return Match{}, false
	}
	lv := &d.root
	var n *node
	for i := range entries {
		e := &entries[i]
		g := lv.byKey[e.Key]
		if g == nil {
			return Match{}, false
		}
		n = g.exact[e.Value]
		if n == nil {
			for _, w := range g.wild {
				if w.matches(e.Value) {
					n = w
					break
				}
			}
			if n == nil {
				n = g.keyOnly
				if n == nil {
					return Match{}, false
				}
			}
		}
		lv = &n.children
	}
	if n.limit == nil {
		return Match{}, false
	}
	m = Match{Limit: n.limit, Policy: n.limit.Policy, Shape: n.limit.Shape, Resource: n.resource, MetricKey: n.metric}
	n.identity(d.cfg.Name, entries, &m)
	if n.limit.Overrides != nil {
		if p, ok := n.limit.Overrides[m.Domain]; ok {
			m.Policy, m.Shape = p, n.limit.OverrideShapes[m.Domain]
		}
	}
	return m, true
}

// identity fills m.Domain and, when it depends on the request, m.MetricKey,
// in at most one allocation (more only for an identity over MaxKeyLen).
func (n *node) identity(rls string, entries []Entry, m *Match) {
	if n.nvars == 0 && !n.metricDyn {
		return
	}
	if n.nvars == 1 && !n.metricDyn {
		v := entries[n.lastVar].Value
		if len(v) <= MaxKeyLen && escapedLen(v) == len(v) {
			m.Domain = v
			return
		}
	}
	detailed, shared := n.limit.DetailedMetric, n.detailedShared
	dlen, mlen := n.nvars-1, 0
	if dlen < 0 {
		dlen = 0
	}
	for i, p := range n.path {
		v := entries[i].Value
		if p.kind != kindExact && !p.share {
			dlen += escapedLen(v)
		}
		if n.metricDyn {
			mlen += 1 + len(p.key)
			if val, ok := p.metricValue(v, detailed, shared); ok {
				mlen += 1 + len(val)
			}
		}
	}
	if n.metricDyn {
		mlen += len(rls)
	}
	var sb strings.Builder
	sb.Grow(dlen + mlen)
	first := true
	for i, p := range n.path {
		if p.kind != kindExact && !p.share {
			if !first {
				sb.WriteByte(',')
			}
			first = false
			writeEscaped(&sb, entries[i].Value)
		}
	}
	if n.metricDyn {
		sb.WriteString(rls)
		for i, p := range n.path {
			sb.WriteByte('.')
			sb.WriteString(p.key)
			if val, ok := p.metricValue(entries[i].Value, detailed, shared); ok {
				sb.WriteByte('_')
				sb.WriteString(val)
			}
		}
	}
	s := sb.String()
	m.Domain = Bound(s[:dlen])
	if n.metricDyn {
		m.MetricKey = s[dlen:]
	}
}

// shared reports that the level's share_threshold applies: it matches
// many values (a fixed value has no effect).
func (p *node) shared() bool { return p.share && p.kind != kindExact }

// metricValue is the value the level adds to MetricKey, if any, for the
// request value v; detailed: the leaf has detailed_metric; shared: and a
// level of its path has share_threshold. These are envoyproxy/ratelimit's
// GetLimit rules: a detailed key writes "_" and the request value at every
// level, even an empty one, unless a level shares, when that level writes
// its pattern and the others "_" and the value only when it is not empty.
func (p *node) metricValue(v string, detailed, shared bool) (string, bool) {
	switch {
	case p.kind == kindExact:
		return p.value, true
	case p.shared() && p.kind == kindWild:
		return p.value, true
	case p.shared():
		return "", false
	case detailed && !shared:
		return v, true
	case detailed || p.valueToMetric:
		return v, v != ""
	case p.kind == kindWild:
		return p.value, true
	}
	return "", false
}

func writeEscaped(sb *strings.Builder, s string) {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if unsafeByte[c] {
			sb.WriteByte('%')
			sb.WriteByte(hexDigits[c>>4])
			sb.WriteByte(hexDigits[c&15])
		} else {
			sb.WriteByte(c)
		}
	}
}

// ApplyReplaces marks the matches whose limit is named in another match's
// Replaces (envoyproxy/ratelimit's replaces: the named limits are dropped
// when a request's descriptors match both). It does not allocate.
func ApplyReplaces(ms []Match) {
	for i := range ms {
		l := ms[i].Limit
		if l == nil || len(l.Replaces) == 0 {
			continue
		}
		for _, name := range l.Replaces {
			for j := range ms {
				if j != i && ms[j].Limit != nil && ms[j].Limit.Name != "" && ms[j].Limit.Name == name {
					ms[j].Replaced = true
				}
			}
		}
	}
}
