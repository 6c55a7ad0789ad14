package config

import (
	"encoding/base64"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// envoyproxy/ratelimit decodes its files with gopkg.in/yaml.v2, which reads
// YAML 1.1: `yes`, `on` and `y` are booleans, and merge keys (`<<: *base`)
// are expanded. The loader parses with yaml.v3 (for its nodes' lines) and
// reads the nodes here as yaml.v2 would, so that a Lyft file means the same
// to both.

// yaml11Words are the plain scalars yaml.v2 resolves by their whole text.
var yaml11Words = map[string]any{
	"y": true, "Y": true, "yes": true, "Yes": true, "YES": true,
	"true": true, "True": true, "TRUE": true,
	"on": true, "On": true, "ON": true,
	"n": false, "N": false, "no": false, "No": false, "NO": false,
	"false": false, "False": false, "FALSE": false,
	"off": false, "Off": false, "OFF": false,
	"": nil, "~": nil, "null": nil, "Null": nil, "NULL": nil,
	".nan": math.NaN(), ".NaN": math.NaN(), ".NAN": math.NaN(),
	".inf": math.Inf(1), ".Inf": math.Inf(1), ".INF": math.Inf(1),
	"+.inf": math.Inf(1), "+.Inf": math.Inf(1), "+.INF": math.Inf(1),
	"-.inf": math.Inf(-1), "-.Inf": math.Inf(-1), "-.INF": math.Inf(-1),
}

var yaml11Float = regexp.MustCompile(`^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`)

// yaml11 is the value yaml.v2 gives the scalar n when it decodes it into an
// interface{}: nil, a bool, an int64, a uint64 (above MaxInt64), a float64,
// or a string (quoted and block scalars, and timestamps, which yaml.v2 keeps
// as text there). ok is false when an explicit tag does not fit the text
// (`!!bool 1`), which yaml.v2 refuses.
func yaml11(n *yaml.Node) (v any, ok bool) {
	tag := ""
	switch {
	case n.Style&yaml.TaggedStyle != 0:
		tag = n.Tag
	case n.Style&(yaml.SingleQuotedStyle|yaml.DoubleQuotedStyle|yaml.LiteralStyle|yaml.FoldedStyle) != 0:
		return n.Value, true
	}
	switch tag {
	case "", "!!bool", "!!int", "!!float", "!!null", "!!timestamp":
	case "!!binary":
		b, err := base64.StdEncoding.DecodeString(n.Value)
		return string(b), err == nil
	default: // !!str, and tags yaml.v2 does not know
		return n.Value, true
	}
	v, got := resolve11(n.Value, tag == "" || tag == "!!timestamp")
	switch {
	case tag == "" || tag == got:
		return v, true
	case tag == "!!float" && got == "!!int":
		switch i := v.(type) {
		case int64:
			return float64(i), true
		case uint64:
			return float64(i), true
		}
	}
	return nil, false
}

// resolve11 resolves the text of a plain scalar as yaml.v2 does, and names
// the tag it found.
func resolve11(s string, timestamps bool) (any, string) {
	if v, ok := yaml11Words[s]; ok {
		switch v.(type) {
		case nil:
			return nil, "!!null"
		case bool:
			return v, "!!bool"
		}
		return v, "!!float"
	}
	if s == "" {
		return s, "!!str"
	}
	switch c := s[0]; {
	case c == '.':
		if f, err := strconv.ParseFloat(s, 64); err == nil {
			return f, "!!float"
		}
	case c == '+' || c == '-' || '0' <= c && c <= '9':
		if timestamps && isTimestamp(s) {
			return s, "!!timestamp"
		}
		plain := strings.ReplaceAll(s, "_", "")
		if i, err := strconv.ParseInt(plain, 0, 64); err == nil {
			return i, "!!int"
		}
		if u, err := strconv.ParseUint(plain, 0, 64); err == nil {
			return u, "!!int"
		}
		if yaml11Float.MatchString(plain) {
			if f, err := strconv.ParseFloat(plain, 64); err == nil {
				return f, "!!float"
			}
		}
	}
	return s, "!!str"
}

// isTimestamp reports whether yaml.v2 reads s as a timestamp.
func isTimestamp(s string) bool {
	if len(s) < 5 || s[4] != '-' {
		return false
	}
	for i := range 4 {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	for _, layout := range []string{"2006-1-2T15:4:5.999999999Z07:00", "2006-1-2t15:4:5.999999999Z07:00", "2006-1-2 15:4:5.999999999", "2006-1-2"} {
		if _, err := time.Parse(layout, s); err == nil {
			return true
		}
	}
	return false
}

// isMerge reports whether the key k is a merge key (a plain <<).
func isMerge(k *yaml.Node) bool {
	return k.Kind == yaml.ScalarNode && k.Tag == "!!merge" && k.Value == "<<"
}

// hasMerge reports whether the mapping n has a merge key.
func hasMerge(n *yaml.Node) bool {
	for i := 0; i < len(n.Content); i += 2 {
		if isMerge(n.Content[i]) {
			return true
		}
	}
	return false
}

// pair is a key of a mapping and its value, once merge keys are expanded.
type pair struct {
	key  string
	k, v *yaml.Node
	own  bool // given in the mapping itself, not merged into it
}

// expansion reads the keys of one mapping as yaml.v2 does.
type expansion struct {
	p     *parser
	root  *yaml.Node
	path  *ypath
	deep  bool
	keyOf func(k *yaml.Node) (string, bool)
	pairs []pair
	at    map[string]int // index in pairs
	stack []*yaml.Node   // the mappings being added, to refuse a cycle
	stop  bool           // after a cycle: one error, not one per path
}

// expand lists the keys of the mapping n as yaml.v2 reads them. A merge key
// (<<) adds the keys of the mapping, or of each mapping of the list, that
// it names, with any merge keys of theirs. yaml.v2 reads a mapping's keys in
// order, so a key given again, merged or not, takes the later value; of a
// list of mappings, the first wins. So `<<: *base` followed by keys of its
// own overrides base's, as YAML means; a key given before a merge that also
// gives it is replaced, with a warning, as envoyproxy/ratelimit reads it.
//
// With deep, a key whose two values are mappings gets them merged (the
// later's keys win), as yaml.v2 decodes into envoyproxy/ratelimit's
// rate_limit struct and metadata map; inside metadata (deep false) a later
// value replaces the earlier. keyOf gives a key node's key, false after
// reporting it. A key given twice in one mapping is still an error.
func (p *parser) expand(n *yaml.Node, path *ypath, deep bool, keyOf func(*yaml.Node) (string, bool)) []pair {
	x := &expansion{p: p, root: n, path: path, deep: deep, keyOf: keyOf}
	x.add(n, 0)
	return x.pairs
}

func (x *expansion) add(n *yaml.Node, depth int) {
	p, mp := x.p, x.path.k("<<")
	switch {
	case x.stop:
		return
	case slices.Contains(x.stack, n):
		p.errf(n, mp, "merges a mapping into itself (an alias inside its own anchor)")
		x.stop = true
		return
	case depth > maxDepth:
		p.errf(n, mp, "merges nested deeper than %d levels", maxDepth)
		x.stop = true
		return
	}
	x.stack = append(x.stack, n)
	defer func() { x.stack = x.stack[:len(x.stack)-1] }()
	var own map[string]int // the line of each key n gives itself, for duplicates
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i]
		if isMerge(k) {
			v := p.resolve(n.Content[i+1])
			switch {
			case v == nil:
				return
			case v.Kind == yaml.MappingNode:
				x.add(v, depth+1)
			case v.Kind == yaml.SequenceNode:
				items := make([]*yaml.Node, len(v.Content))
				for j, it := range v.Content {
					if items[j] = p.resolve(it); items[j] == nil {
						return
					}
					if items[j].Kind != yaml.MappingNode {
						p.errf(items[j], mp.i(j), "must be a mapping to merge, not %s", kindName(items[j]))
						items[j] = nil
					}
				}
				for j := len(items) - 1; j >= 0; j-- {
					if items[j] != nil {
						x.add(items[j], depth+1)
					}
				}
			default:
				p.errf(v, mp, "must be a mapping or a list of mappings to merge, not %s", kindName(v))
			}
			continue
		}
		key, ok := x.keyOf(k)
		if !ok {
			continue
		}
		if line, dup := own[key]; dup {
			p.errf(k, x.path.k(key), "key given twice (first at line %d)", line)
			continue
		}
		if own == nil {
			own = map[string]int{}
		}
		own[key] = k.Line
		v := p.resolve(n.Content[i+1])
		if v == nil {
			return
		}
		x.set(pair{key: key, k: k, v: v, own: n == x.root})
	}
}

func (x *expansion) set(e pair) {
	i, seen := x.at[e.key]
	if !seen {
		if x.at == nil {
			x.at = map[string]int{}
		}
		x.at[e.key] = len(x.pairs)
		x.pairs = append(x.pairs, e)
		return
	}
	old := &x.pairs[i]
	if old.own && !e.own {
		x.p.warnf(old.k, x.path.k(e.key), "replaced by the merge (<<) after it, as envoyproxy/ratelimit reads it: write <<: before the keys that override it")
	}
	if x.deep && old.v.Kind == yaml.MappingNode && e.v.Kind == yaml.MappingNode {
		// The earlier mapping merged into the later one: its keys first,
		// then the later's, which win.
		merge := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!merge", Value: "<<", Line: e.v.Line, Column: e.v.Column}
		e.v = &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Line: e.v.Line, Column: e.v.Column,
			Content: append([]*yaml.Node{merge, old.v}, e.v.Content...)}
	}
	*old = e
}
