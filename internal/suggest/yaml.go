package suggest

import (
	"bytes"
	"fmt"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/charonlimit/charon/descriptors"
)

type yamlTier struct {
	Limit  int64  `yaml:"limit"`
	Window string `yaml:"window"`
	Active string `yaml:"active"`
}

type yamlNode struct {
	Key         string      `yaml:"key"`
	Value       string      `yaml:"value,omitempty"`
	Tiers       []yamlTier  `yaml:"tiers,omitempty"`
	ShadowMode  bool        `yaml:"shadow_mode,omitempty"`
	Descriptors []*yamlNode `yaml:"descriptors,omitempty"`
}

type yamlFile struct {
	Domain      string      `yaml:"domain"`
	Descriptors []*yamlNode `yaml:"descriptors"`
}

// Files renders the proposals as configuration files, one per RLS domain
// (named after it, ".yaml"), that `charon config check` accepts: each
// rule's path becomes nested descriptors (fixed values and wildcards as
// the rule had them, a key alone where it had one, so each value is a
// Charon domain of its own) whose leaf has the proposed tier, in shadow
// mode where the rule was. Traffic that matched no rule becomes key-only
// descriptors. A comment at the top of each file gives the replay's
// figures. Proposals without a limit (Note) are left out.
func Files(ps []Proposal) (map[string][]byte, error) {
	byDomain := make(map[string][]Proposal)
	var order []string
	for _, p := range ps {
		if p.Policy == nil {
			continue
		}
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
			insert(&f.Descriptors, p.Path, yamlTier{Limit: p.Limit, Window: p.Window.String(), Active: "unbounded"}, p.Shadow)
			fmt.Fprintf(&b, "# %s\n", Figures(&p))
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

// Figures says what the replay found for p in one line.
func Figures(p *Proposal) string {
	what := p.Descriptor()
	if p.Resource == "" {
		what += " (matched no rule)"
	}
	if p.Policy == nil {
		return fmt.Sprintf("%s: %d hits from %d domains; kept: %s.", what, p.Hits, p.Domains, p.Note)
	}
	s := fmt.Sprintf("%s: %d hits from %d domains; per domain and %s window p50 %d, p99 %d, max %d; %d per %s would have rejected %d (%.2f%%).",
		what, p.Hits, p.Domains, window(p.Window), p.P50, p.P99, p.Max, p.Limit, window(p.Window), p.Rejected,
		100*float64(p.Rejected)/float64(max(p.Hits, 1)))
	if p.Note != "" {
		s += " " + p.Note + "."
	}
	return s
}

// window writes a duration as a configuration would: "1m", not "1m0s".
func window(d time.Duration) string {
	s := d.String()
	s, _ = strings.CutSuffix(s, "m0s")
	if len(s) < len(d.String()) {
		s += "m"
	}
	if t, ok := strings.CutSuffix(s, "h0m"); ok {
		s = t + "h"
	}
	return s
}

// insert adds a leaf of tier t at path under nodes.
func insert(nodes *[]*yamlNode, path []descriptors.Entry, t yamlTier, shadow bool) {
	var n *yamlNode
	for _, c := range *nodes {
		if c.Key == path[0].Key && c.Value == path[0].Value {
			n = c
		}
	}
	if n == nil {
		n = &yamlNode{Key: path[0].Key, Value: path[0].Value}
		*nodes = append(*nodes, n)
	}
	if len(path) == 1 {
		n.Tiers, n.ShadowMode = []yamlTier{t}, shadow
		return
	}
	insert(&n.Descriptors, path[1:], t, shadow)
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
