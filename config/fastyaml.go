package config

import (
	"strings"

	"gopkg.in/yaml.v3"
)

// fastParse builds the yaml.Node tree that yaml.v3 builds for data, when data
// keeps to the plain subset of YAML that configuration files use:
//
//   - ASCII text without tabs or carriage returns, one document, maybe
//     opened by "---", without "..." or "%" directives;
//   - block mappings with scalar keys, block sequences (also a sequence at
//     its parent key's indentation), "- key: value" compact mappings;
//   - flow mappings and sequences written on one line;
//   - plain scalars on one line, single-quoted scalars, double-quoted
//     scalars without escapes;
//   - comments, on their own lines or after a value.
//
// It reports false, and the caller parses with yaml.v3, for anything else:
// anchors, aliases, tags, block scalars (| and >), multi-line scalars or flow
// collections, empty values, complex or merge keys, and any text that is not
// valid YAML. It never reports an error of its own: yaml.v3 does, for the
// whole file. Comments are not kept in the nodes, as the loader does not read
// them.
//
// It is several times faster than yaml.v3 and allocates far less: nodes and
// their Content come from slabs, and every scalar's Value is a substring of
// one copy of data, so the strings the loader keeps share that copy.
// FuzzFastYAML checks that the trees it builds are those of yaml.v3.
func fastParse(data []byte) (*yaml.Node, bool) {
	var f fastParser
	return f.parse(data)
}

// parse is fastParse reusing the memory of f's previous parse: the trees it
// returned before must no longer be in use.
func (f *fastParser) parse(data []byte) (*yaml.Node, bool) {
	f.reset(string(data))
	if !f.split() || len(f.lines) == 0 {
		return nil, false
	}
	first := f.lines[0]
	var root *yaml.Node
	if f.isSeqEntry() {
		root = f.sequence(first.indent, 0)
	} else {
		root = f.mappingAt(first.indent, 0)
	}
	if root == nil || f.li != len(f.lines) {
		return nil, false
	}
	doc := f.node()
	doc.Kind = yaml.DocumentNode
	doc.Line, doc.Column = first.num, 1
	doc.Content = f.content([]*yaml.Node{root})
	return doc, true
}

// maxFastDepth bounds the nesting the fast parser follows (yaml.v3 and the
// loader take deeper files, and refuse them, on their own).
const maxFastDepth = 100

type fastLine struct {
	start, end int // offsets of the line's text in src, without "\n"
	indent     int // spaces before the content
	num        int // 1-based line number
}

// fastParser is the state of fastParse. Its zero value is ready to use; it
// is not safe for concurrent use.
type fastParser struct {
	src   string
	lines []fastLine // the lines with content: no blank or comment-only lines
	li    int        // current line
	col   int        // cursor, an offset within the current line

	nodes [][]yaml.Node  // slabs of nodes, nodes[ni][:nn] in use
	ni    int            // current node slab
	nn    int            // nodes used in nodes[ni]
	ptrs  [][]*yaml.Node // slabs of Content slices, likewise
	pi    int
	pn    int
	stack []*yaml.Node // children of the collections being parsed
	tags  map[string]string
}

const (
	nodeSlab = 512
	ptrSlab  = 2048
)

func (f *fastParser) reset(src string) {
	f.src, f.lines, f.li, f.col = src, f.lines[:0], 0, 0
	f.ni, f.nn, f.pi, f.pn = 0, 0, 0, 0
	f.stack = f.stack[:0]
	if len(f.tags) > 4096 {
		clear(f.tags)
	}
}

// split checks the characters of src and finds its lines with content.
func (f *fastParser) split() bool {
	s := f.src
	num := 0
	opened := false
	for start := 0; start < len(s); {
		num++
		end := start
		for end < len(s) && s[end] != '\n' {
			c := s[end]
			if c < 0x20 || c > 0x7e {
				return false // tabs, CR, control characters, non-ASCII
			}
			end++
		}
		line := s[start:end]
		indent := 0
		for indent < len(line) && line[indent] == ' ' {
			indent++
		}
		if indent < len(line) && line[indent] != '#' {
			if indent == 0 && (hasPrefix(line, "---") || hasPrefix(line, "...") || line[0] == '%') {
				// Only a "---" opening the one document.
				rest := strings.TrimLeft(line[min(3, len(line)):], " ")
				if opened || len(f.lines) > 0 || !hasPrefix(line, "---") || (rest != "" && (rest[0] != '#' || len(rest) == len(line)-3)) {
					return false
				}
				opened = true
				start = end + 1
				continue
			}
			f.lines = append(f.lines, fastLine{start: start, end: end, indent: indent, num: num})
		}
		start = end + 1
	}
	return true
}

func hasPrefix(s, p string) bool { return len(s) >= len(p) && s[:len(p)] == p }

func (f *fastParser) text() string { l := f.lines[f.li]; return f.src[l.start:l.end] }

// at is the byte at the cursor, 0 at the end of the line.
func (f *fastParser) at(off int) byte {
	t := f.text()
	if f.col+off < len(t) {
		return t[f.col+off]
	}
	return 0
}

func (f *fastParser) skipSpaces() {
	for f.at(0) == ' ' {
		f.col++
	}
}

// endOfLine consumes the rest of the line when it holds only spaces and a
// comment, and moves to the next line.
func (f *fastParser) endOfLine() bool {
	if c := f.at(0); c != 0 && c != ' ' {
		return false
	}
	f.skipSpaces()
	if c := f.at(0); c != 0 && c != '#' {
		return false
	}
	f.next()
	return true
}

func (f *fastParser) next() {
	f.li++
	if f.li < len(f.lines) {
		f.col = f.lines[f.li].indent
	}
}

func (f *fastParser) done() bool { return f.li >= len(f.lines) }

// isSeqEntry reports whether the cursor is on "- " or a "-" ending the line.
func (f *fastParser) isSeqEntry() bool {
	f.col = f.lines[f.li].indent
	return f.at(0) == '-' && (f.at(1) == ' ' || f.at(1) == 0)
}

func (f *fastParser) node() *yaml.Node {
	if f.ni < len(f.nodes) && f.nn == nodeSlab {
		f.ni, f.nn = f.ni+1, 0
	}
	if f.ni == len(f.nodes) {
		f.nodes = append(f.nodes, make([]yaml.Node, nodeSlab))
	}
	n := &f.nodes[f.ni][f.nn]
	f.nn++
	*n = yaml.Node{}
	return n
}

func (f *fastParser) content(items []*yaml.Node) []*yaml.Node {
	if len(items) > ptrSlab {
		return append([]*yaml.Node(nil), items...)
	}
	if f.pi < len(f.ptrs) && f.pn+len(items) > ptrSlab {
		f.pi, f.pn = f.pi+1, 0
	}
	if f.pi == len(f.ptrs) {
		f.ptrs = append(f.ptrs, make([]*yaml.Node, ptrSlab))
	}
	start := f.pn
	f.pn += copy(f.ptrs[f.pi][start:], items)
	return f.ptrs[f.pi][start:f.pn:f.pn]
}

// collection starts a mapping or sequence node at the cursor.
func (f *fastParser) collection(kind yaml.Kind, tag string) *yaml.Node {
	n := f.node()
	n.Kind, n.Tag = kind, tag
	n.Line, n.Column = f.lines[f.li].num, f.col+1
	return n
}

// finish gives n the children pushed on the stack since base.
func (f *fastParser) finish(n *yaml.Node, base int) *yaml.Node {
	n.Content = f.content(f.stack[base:])
	f.stack = f.stack[:base]
	return n
}

// block parses the block node starting at the cursor, the first content of
// a line more indented than its parent.
func (f *fastParser) block(depth int) *yaml.Node {
	if f.isSeqEntry() {
		return f.sequence(f.col, depth)
	}
	return f.mappingAt(f.col, depth)
}

// mappingAt parses a block mapping whose first key is at the cursor, in
// column c.
func (f *fastParser) mappingAt(c, depth int) *yaml.Node {
	line := f.li
	key := f.scalar(false)
	if key == nil || f.li != line {
		return nil
	}
	return f.mapping(c, key, depth)
}

// mapping parses a block mapping in column c whose first key has been read,
// the cursor on the ":" after it.
func (f *fastParser) mapping(c int, key *yaml.Node, depth int) *yaml.Node {
	if depth > maxFastDepth {
		return nil
	}
	n := f.node()
	n.Kind, n.Tag, n.Line, n.Column = yaml.MappingNode, "!!map", key.Line, key.Column
	base := len(f.stack)
	for {
		if f.at(0) != ':' || (f.at(1) != ' ' && f.at(1) != 0) {
			return nil
		}
		f.col++
		f.stack = append(f.stack, key)
		f.skipSpaces()
		var v *yaml.Node
		if ch := f.at(0); ch == 0 || ch == '#' {
			f.next()
			if f.done() {
				return nil // empty value
			}
			switch m := f.lines[f.li].indent; {
			case m > c:
				v = f.block(depth + 1)
			case m == c && f.isSeqEntry():
				v = f.sequence(c, depth+1)
			default:
				return nil // empty value
			}
		} else {
			if v = f.inline(depth + 1); v == nil || !f.endOfLine() {
				return nil
			}
		}
		if v == nil {
			return nil
		}
		f.stack = append(f.stack, v)
		if f.done() {
			break
		}
		m := f.lines[f.li].indent
		if m < c {
			break
		}
		if m > c {
			return nil
		}
		f.col = c
		line := f.li
		if key = f.scalar(false); key == nil || f.li != line {
			return nil
		}
	}
	return f.finish(n, base)
}

// sequence parses a block sequence whose entries are in column c, the
// cursor on the first "-".
func (f *fastParser) sequence(c, depth int) *yaml.Node {
	if depth > maxFastDepth {
		return nil
	}
	n := f.collection(yaml.SequenceNode, "!!seq")
	base := len(f.stack)
	for {
		f.col++ // "-"
		f.skipSpaces()
		var item *yaml.Node
		switch ch := f.at(0); {
		case ch == 0 || ch == '#':
			f.next()
			if f.done() || f.lines[f.li].indent <= c {
				return nil // empty entry
			}
			item = f.block(depth + 1)
		case ch == '-' && (f.at(1) == ' ' || f.at(1) == 0):
			return nil // "- - a"
		case ch == '[' || ch == '{':
			if item = f.inline(depth + 1); item == nil || !f.endOfLine() {
				return nil
			}
		default:
			k := f.col
			line := f.li
			s := f.scalar(false)
			if s == nil || f.li != line {
				return nil
			}
			if f.at(0) == ':' {
				item = f.mapping(k, s, depth+1)
			} else if f.endOfLine() {
				item = s
			}
		}
		if item == nil {
			return nil
		}
		f.stack = append(f.stack, item)
		if f.done() {
			break
		}
		m := f.lines[f.li].indent
		if m < c || (m == c && !f.isSeqEntry()) {
			break
		}
		if m > c {
			return nil
		}
	}
	return f.finish(n, base)
}

// inline parses a value that starts on the current line after "key: ":
// a flow collection or a scalar.
func (f *fastParser) inline(depth int) *yaml.Node {
	switch f.at(0) {
	case '[', '{':
		return f.flow(depth)
	}
	if f.at(0) == '-' && (f.at(1) == ' ' || f.at(1) == 0) {
		return nil
	}
	return f.scalar(false)
}

// flow parses a flow node: a collection on one line or a scalar.
func (f *fastParser) flow(depth int) *yaml.Node {
	if depth > maxFastDepth {
		return nil
	}
	var n *yaml.Node
	var closer byte
	switch f.at(0) {
	case '[':
		n, closer = f.collection(yaml.SequenceNode, "!!seq"), ']'
	case '{':
		n, closer = f.collection(yaml.MappingNode, "!!map"), '}'
	default:
		return f.scalar(true)
	}
	n.Style = yaml.FlowStyle
	base := len(f.stack)
	f.col++
	f.skipSpaces()
	if f.at(0) == closer {
		f.col++
		return f.finish(n, base)
	}
	for {
		if c := f.at(0); c == ',' || c == closer || c == 0 {
			return nil // empty entry or unclosed on this line
		}
		if closer == '}' {
			k := f.scalar(true)
			if k == nil || f.at(0) != ':' || f.at(1) != ' ' {
				return nil
			}
			f.col++
			f.skipSpaces()
			f.stack = append(f.stack, k)
			if c := f.at(0); c == ',' || c == '}' || c == 0 {
				return nil // empty value
			}
		}
		v := f.flow(depth + 1)
		if v == nil {
			return nil
		}
		f.stack = append(f.stack, v)
		f.skipSpaces()
		switch f.at(0) {
		case ',':
			f.col++
			f.skipSpaces()
			if f.at(0) == closer {
				return nil // trailing comma
			}
		case closer:
			f.col++
			return f.finish(n, base)
		default:
			return nil
		}
	}
}

// scalar reads a scalar on the current line at the cursor: plain (in flow
// context when inFlow), single-quoted, or double-quoted without escapes.
// The cursor ends after it (for a plain scalar, at its end before any
// spaces).
func (f *fastParser) scalar(inFlow bool) *yaml.Node {
	t := f.text()
	start := f.col
	var value string
	var style yaml.Style
	switch q := f.at(0); q {
	case '\'', '"':
		i := start + 1
		escaped := false
		for {
			if i >= len(t) {
				return nil // multi-line
			}
			if t[i] == '\\' && q == '"' {
				return nil // escapes
			}
			if t[i] == q {
				if q == '\'' && i+1 < len(t) && t[i+1] == '\'' {
					escaped = true
					i += 2
					continue
				}
				break
			}
			i++
		}
		value = t[start+1 : i]
		if escaped {
			value = unquoteSingle(value)
		}
		f.col = i + 1
		style = yaml.DoubleQuotedStyle
		if q == '\'' {
			style = yaml.SingleQuotedStyle
		}
	default:
		switch q {
		case 0, ' ', '-', '?', ':', ',', '[', ']', '{', '}', '#', '&', '*', '!', '|', '>', '%', '@', '`':
			if q != '-' || f.at(1) == ' ' || f.at(1) == 0 {
				return nil
			}
		}
		i := start
		for i < len(t) {
			c := t[i]
			if c == ':' && (i+1 == len(t) || t[i+1] == ' ') {
				break
			}
			if c == '#' && t[i-1] == ' ' {
				break
			}
			if inFlow {
				switch c {
				case ',', '[', ']', '{', '}':
				case ':':
					return nil // "a:b" in a flow collection
				default:
					i++
					continue
				}
				break
			}
			i++
		}
		end := i
		for end > start && t[end-1] == ' ' {
			end--
		}
		value = t[start:end]
		f.col = end
	}
	if f.col-start > 1000 {
		return nil // yaml.v3 limits simple keys to 1024 characters
	}
	if style == 0 && value == "<<" {
		return nil // yaml.v3 tags it !!merge
	}
	n := f.node()
	n.Kind, n.Value, n.Style = yaml.ScalarNode, value, style
	n.Line, n.Column = f.lines[f.li].num, start+1
	if style != 0 {
		n.Tag = "!!str"
	} else {
		n.Tag = f.tag(value)
	}
	return n
}

func unquoteSingle(s string) string {
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		b = append(b, s[i])
		if s[i] == '\'' {
			i++
		}
	}
	return string(b)
}

// tag is the tag yaml.v3 resolves for a plain scalar. Text starting with a
// character that cannot begin a number, bool, null or float is a string
// without a look at the rest (as in yaml.v3's resolve); the others are
// resolved by yaml.v3 and remembered.
func (f *fastParser) tag(v string) string {
	switch c := v[0]; {
	case c >= '0' && c <= '9', c == '+', c == '-', c == '.', c == '~':
	case c == 'y', c == 'Y', c == 'n', c == 'N', c == 't', c == 'T', c == 'f', c == 'F', c == 'o', c == 'O':
	default:
		return "!!str"
	}
	if t, ok := f.tags[v]; ok {
		return t
	}
	if f.tags == nil {
		f.tags = map[string]string{}
	}
	t := (&yaml.Node{Kind: yaml.ScalarNode, Value: v}).ShortTag()
	f.tags[v] = t
	return t
}
