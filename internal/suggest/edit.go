package suggest

import (
	"bytes"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"gopkg.in/yaml.v3"

	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/descriptors"
)

// Edit returns every file of the configuration cfg was loaded from (fsys),
// with the proposed limits written in place: the number of a rule's
// rate_limit.requests_per_unit, or of its one tier's limit, is replaced in
// the file's text, and nothing else of the file changes but a comment at
// its top with the replay's figures. Rules the log has no proposal for
// (unlimited, shadow, unused, or not one limit) are kept as they are
// written, so the result is the whole configuration, ready for `charon
// replay` and `charon config diff`. A limit written through a YAML alias
// or merge key, or quoted, is not changed (its figures say so). It also
// returns the proposals that have no rule in cfg to go into: traffic that
// matched no rule, or rules the configuration no longer has.
func Edit(fsys fs.FS, cfg *config.Config, ps []Proposal) (files map[string][]byte, unplaced []Proposal, err error) {
	type edit struct {
		off, n int
		text   string
	}
	edits := map[string][]edit{}
	notes := map[string][]string{}
	docs := map[string]*yaml.Node{}
	src := map[string][]byte{}
	files = make(map[string][]byte, len(cfg.Files))
	for _, name := range cfg.Files {
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, nil, err
		}
		src[name] = b
	}
	for i := range ps {
		p := &ps[i]
		if p.Leaf == nil {
			unplaced = append(unplaced, *p)
			continue
		}
		file := p.Leaf.Limit.File
		b, ok := src[file]
		if !ok {
			unplaced = append(unplaced, *p)
			continue
		}
		if p.Policy != nil {
			doc := docs[file]
			if doc == nil {
				doc = new(yaml.Node)
				if err := yaml.Unmarshal(b, doc); err != nil {
					return nil, nil, fmt.Errorf("%s: %w", file, err)
				}
				docs[file] = doc
			}
			if n := limitNode(doc, p.Leaf.Path); n == nil {
				p.Note = "its limit is written through an alias, a merge key or quotes: not changed"
			} else if off, ok := offset(b, n.Line, n.Column); ok {
				edits[file] = append(edits[file], edit{off, len(n.Value), strconv.FormatInt(p.Limit, 10)})
			}
		}
		notes[file] = append(notes[file], fmt.Sprintf("# %s: %s", p.RLSDomain, Figures(p)))
	}
	for _, name := range cfg.Files {
		b := src[name]
		es := edits[name]
		if len(es) == 0 && len(notes[name]) == 0 {
			files[name] = b
			continue
		}
		slices.SortFunc(es, func(a, b edit) int { return b.off - a.off })
		out := slices.Clone(b)
		for _, e := range es {
			out = slices.Concat(out[:e.off], []byte(e.text), out[e.off+e.n:])
		}
		var head bytes.Buffer
		head.WriteString("# Limits proposed by charon suggest from a decision log:\n")
		for _, n := range notes[name] {
			head.WriteString(strings.ReplaceAll(n, "\n", " "))
			head.WriteByte('\n')
		}
		files[name] = append(head.Bytes(), out...)
	}
	return files, unplaced, nil
}

// limitNode finds, in a configuration file's document, the plain scalar
// that holds the limit of the rule at path: rate_limit.requests_per_unit,
// or tiers[0].limit. Nil when it is not written plainly on that rule.
func limitNode(doc *yaml.Node, path []descriptors.Entry) *yaml.Node {
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		return nil
	}
	m := doc.Content[0]
	for _, e := range path {
		seq := get(m, "descriptors")
		if seq == nil || seq.Kind != yaml.SequenceNode {
			return nil
		}
		var next *yaml.Node
		for _, d := range seq.Content {
			if d.Kind != yaml.MappingNode {
				continue
			}
			k, v := get(d, "key"), get(d, "value")
			val := ""
			if v != nil {
				val = v.Value
			}
			if k != nil && k.Value == e.Key && val == e.Value {
				next = d
			}
		}
		if next == nil {
			return nil
		}
		m = next
	}
	var n *yaml.Node
	if rl := get(m, "rate_limit"); rl != nil && rl.Kind == yaml.MappingNode {
		n = get(rl, "requests_per_unit")
	} else if ts := get(m, "tiers"); ts != nil && ts.Kind == yaml.SequenceNode && len(ts.Content) == 1 && ts.Content[0].Kind == yaml.MappingNode {
		n = get(ts.Content[0], "limit")
	}
	if n == nil || n.Kind != yaml.ScalarNode || n.Style != 0 {
		return nil
	}
	return n
}

// get is the value of key in mapping m: nil when absent, or when m merges
// another mapping (<<), whose keys the text does not hold.
func get(m *yaml.Node, key string) *yaml.Node {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	var v *yaml.Node
	for i := 0; i+1 < len(m.Content); i += 2 {
		switch m.Content[i].Value {
		case "<<":
			return nil
		case key:
			v = m.Content[i+1]
		}
	}
	return v
}

// offset is the byte offset of a 1-based line and column (in characters)
// in b.
func offset(b []byte, line, col int) (int, bool) {
	off := 0
	for l := 1; l < line; l++ {
		i := bytes.IndexByte(b[off:], '\n')
		if i < 0 {
			return 0, false
		}
		off += i + 1
	}
	for c := 1; c < col; c++ {
		if off >= len(b) {
			return 0, false
		}
		_, size := utf8.DecodeRune(b[off:])
		off += size
	}
	return off, off <= len(b)
}
