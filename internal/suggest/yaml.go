package suggest

import (
	"bytes"
	"fmt"
	"strings"

	"gopkg.in/yaml.v3"
)

type yamlTier struct {
	Limit  int64  `yaml:"limit"`
	Window string `yaml:"window"`
	Active string `yaml:"active"`
}

type yamlNode struct {
	Key         string      `yaml:"key"`
	Tiers       []yamlTier  `yaml:"tiers,omitempty"`
	Descriptors []*yamlNode `yaml:"descriptors,omitempty"`
}

type yamlFile struct {
	Domain      string      `yaml:"domain"`
	Descriptors []*yamlNode `yaml:"descriptors"`
}

// Files renders the proposals as configuration files, one per RLS domain
// (named after it, ".yaml"), that `charon config check` accepts: each key
// path becomes nested key-only descriptors whose leaf has the proposed
// tier, so every distinct value is a Charon domain of its own. A comment
// at the top of each file gives the replay's figures.
func Files(ps []Proposal) (map[string][]byte, error) {
	byDomain := make(map[string][]Proposal)
	var order []string
	for _, p := range ps {
		if _, ok := byDomain[p.RLSDomain]; !ok {
			order = append(order, p.RLSDomain)
		}
		byDomain[p.RLSDomain] = append(byDomain[p.RLSDomain], p)
	}
	out := make(map[string][]byte, len(order))
	for _, d := range order {
		f := yamlFile{Domain: d}
		var b bytes.Buffer
		fmt.Fprintf(&b, "# Proposed by charon suggest from a decision log.\n")
		for _, p := range byDomain[d] {
			insert(&f.Descriptors, p.Keys, yamlTier{Limit: p.Limit, Window: p.Window.String(), Active: "unbounded"})
			fmt.Fprintf(&b, "# %s: %d hits from %d domains; per domain and %s window p50 %d, p99 %d, max %d; %d per %s would have rejected %d (%.2f%%).\n",
				strings.Join(p.Keys, "."), p.Hits, p.Domains, p.Window, p.P50, p.P99, p.Max, p.Limit, p.Window, p.Rejected,
				100*float64(p.Rejected)/float64(max(p.Hits, 1)))
		}
		enc := yaml.NewEncoder(&b)
		enc.SetIndent(2)
		if err := enc.Encode(&f); err != nil {
			return nil, err
		}
		enc.Close()
		name := fileName(d)
		for i := 2; out[name] != nil; i++ {
			name = fmt.Sprintf("%s_%d.yaml", strings.TrimSuffix(fileName(d), ".yaml"), i)
		}
		out[name] = b.Bytes()
	}
	return out, nil
}

// insert adds a leaf of tier t at the key path keys under nodes.
func insert(nodes *[]*yamlNode, keys []string, t yamlTier) {
	var n *yamlNode
	for _, c := range *nodes {
		if c.Key == keys[0] {
			n = c
		}
	}
	if n == nil {
		n = &yamlNode{Key: keys[0]}
		*nodes = append(*nodes, n)
	}
	if len(keys) == 1 {
		n.Tiers = []yamlTier{t}
		return
	}
	insert(&n.Descriptors, keys[1:], t)
}

// fileName is a safe file name for an RLS domain.
func fileName(domain string) string {
	var b strings.Builder
	for _, r := range domain {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	if s := strings.Trim(b.String(), "."); s != "" {
		return s + ".yaml"
	}
	return "domain.yaml"
}
