package config

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"gopkg.in/yaml.v3"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/tiers"
)

const (
	maxDepth = 32        // descriptor nesting, and YAML nesting under a leaf
	maxNodes = 1_000_000 // YAML nodes visited per file, aliases expanded
)

// state collects the problems of one Load.
type state struct {
	opts  Options
	errs  []*Error
	warns []Warning
}

// fileConfig is one parsed file.
type fileConfig struct {
	file              string
	domain            string
	line              int
	ignoreLimits      bool
	allowUnconfigured bool
	// calendar is the file's calendar units (parser.calendar), set says
	// the file's calendar_units key gave it, at calendarLine.
	calendar     *time.Location
	calendarSet  bool
	calendarLine int
	nodes        []*pnode
}

// pnode is a parsed descriptor, with its position for later errors.
type pnode struct {
	key, value string
	line       int
	index      int // in its list, for errors found when merging
	node       descriptors.Node
	children   []*pnode
}

// parser parses one file; the parsers of several files run concurrently
// and their problems are gathered in file order.
type parser struct {
	opts    Options
	errs    []*Error
	warns   []Warning
	file    string
	visited int
	tooBig  bool
	// expanded holds the keys of the mappings with merge keys read so far.
	expanded map[*yaml.Node][]pair
	// calendar is the zone of the file's calendar units (Options.
	// CalendarUnits, or the file's calendar_units), nil for none.
	calendar *time.Location
}

func (p *parser) errf(n *yaml.Node, path *ypath, format string, args ...any) {
	p.errs = append(p.errs, &Error{File: p.file, Line: lineOf(n), Path: path.String(), Message: fmt.Sprintf(format, args...)})
}

func (p *parser) warnf(n *yaml.Node, path *ypath, format string, args ...any) {
	p.warns = append(p.warns, Warning{File: p.file, Line: lineOf(n), Path: path.String(), Message: fmt.Sprintf(format, args...)})
}

// lineOf is the line of n, 0 for nil.
func lineOf(n *yaml.Node) int {
	if n == nil {
		return 0
	}
	return n.Line
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): `)

func (p *parser) parseFile(data []byte) *fileConfig {
	doc := p.parseYAML(data)
	if doc == nil {
		return nil
	}
	fc := &fileConfig{file: p.file, line: 1}
	var root *yaml.Node
	if len(doc.Content) > 0 {
		root = p.resolve(doc.Content[0])
	}
	if root == nil || root.Tag == "!!null" {
		p.errf(root, rootPath("domain"), "empty domain: the file has no configuration")
		return nil
	}
	if root.Kind != yaml.MappingNode {
		p.errf(root, nil, "must be a mapping with domain and descriptors, not %s", kindName(root))
		return nil
	}
	var descs *yaml.Node
	var domainNode *yaml.Node
	p.fields(root, nil, func(key string, k, v *yaml.Node) bool {
		switch key {
		case "domain":
			domainNode = k
			fc.domain, _ = p.str(v, rootPath("domain"))
			fc.line = k.Line
		case "descriptors":
			descs = v
		case "ignore_limits":
			fc.ignoreLimits, _ = p.boolean(v, rootPath("ignore_limits"))
		case "allow_unconfigured":
			fc.allowUnconfigured, _ = p.boolean(v, rootPath("allow_unconfigured"))
		case "calendar_units":
			if loc, ok := p.calendarUnits(v, rootPath("calendar_units")); ok {
				p.calendar, fc.calendarSet, fc.calendarLine = loc, true, k.Line
			}
		default:
			return false
		}
		return true
	})
	if fc.domain == "" {
		p.errf(cmp.Or(domainNode, root), rootPath("domain"), "empty domain")
	}
	fc.calendar = p.calendar
	if descs != nil {
		fc.nodes = p.descriptors(descs, rootPath("descriptors"), 1)
	}
	if fc.domain == "" {
		return nil
	}
	return fc
}

// parseYAML parses data with yaml.v3, nil after reporting an error.
func (p *parser) parseYAML(data []byte) *yaml.Node {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		p.yamlErr(err)
		return nil
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		if len(extra.Content) > 0 && extra.Content[0].Tag != "!!null" {
			p.errf(&extra, nil, "more than one YAML document in the file")
		}
	} else if !errors.Is(err, io.EOF) {
		p.yamlErr(err)
		return nil
	}
	return &doc
}

func (p *parser) yamlErr(err error) {
	msg := err.Error()
	line := 0
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		line, _ = strconv.Atoi(m[1])
		msg = msg[len(m[0]):]
	} else {
		msg = strings.TrimPrefix(msg, "yaml: ")
	}
	p.errs = append(p.errs, &Error{File: p.file, Line: line, Message: "invalid YAML: " + msg})
}

// resolve follows aliases and counts nodes, so that a file expanding to too
// many nodes (alias bombs) is refused.
func (p *parser) resolve(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	p.visited++
	if p.visited > maxNodes {
		if !p.tooBig {
			p.tooBig = true
			p.errf(n, nil, "file too large: more than %d YAML nodes once aliases are expanded", maxNodes)
		}
		return nil
	}
	return n
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "empty"
		}
		return fmt.Sprintf("%q", n.Value)
	}
	return "an unknown node"
}

// fields calls fn for each key of the mapping n, merge keys (<<: *base)
// expanded as envoyproxy/ratelimit's yaml.v2 expands them (see expand); fn
// returns false for an unknown key. Non-string keys, keys given twice in one
// mapping and unknown keys are errors.
func (p *parser) fields(n *yaml.Node, path *ypath, fn func(key string, k, v *yaml.Node) bool) {
	if hasMerge(n) {
		for _, e := range p.merged(n, path) {
			if !fn(e.key, e.k, e.v) {
				p.errf(e.k, path.k(e.key), "unknown key %q", e.key)
			}
		}
		return
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], p.resolve(n.Content[i+1])
		if v == nil {
			return
		}
		if k.Kind != yaml.ScalarNode || k.Tag != "!!str" {
			p.errf(k, path, "key %s is not a string", kindName(k))
			continue
		}
		dup := 0
		for j := 0; j < i; j += 2 {
			if prev := n.Content[j]; prev.Tag == "!!str" && prev.Value == k.Value {
				dup = prev.Line
				break
			}
		}
		if dup > 0 {
			p.errf(k, path.k(k.Value), "key given twice (first at line %d)", dup)
			continue
		}
		if !fn(k.Value, k, v) {
			p.errf(k, path.k(k.Value), "unknown key %q", k.Value)
		}
	}
}

// merged expands the mapping n, which has merge keys, once: a node reached
// through several aliases reports its problems once, and require finds the
// keys fields read.
func (p *parser) merged(n *yaml.Node, path *ypath) []pair {
	if pairs, ok := p.expanded[n]; ok {
		return pairs
	}
	pairs := p.expand(n, path, true, func(k *yaml.Node) (string, bool) {
		if k.Kind != yaml.ScalarNode || k.Tag != "!!str" {
			p.errf(k, path, "key %s is not a string", kindName(k))
			return "", false
		}
		return k.Value, true
	})
	if p.expanded == nil {
		p.expanded = map[*yaml.Node][]pair{}
	}
	p.expanded[n] = pairs
	return pairs
}

// list returns the items of a sequence (nil for an empty value).
func (p *parser) list(n *yaml.Node, path *ypath) []*yaml.Node {
	if n.Tag == "!!null" {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		p.errf(n, path, "must be a list, not %s", kindName(n))
		return nil
	}
	out := make([]*yaml.Node, 0, len(n.Content))
	for _, it := range n.Content {
		if it = p.resolve(it); it == nil {
			return out
		}
		out = append(out, it)
	}
	return out
}

func (p *parser) mapping(n *yaml.Node, path *ypath) bool {
	if n.Kind != yaml.MappingNode {
		p.errf(n, path, "must be a mapping, not %s", kindName(n))
		return false
	}
	return true
}

// values reads the mapping n as fields does: read reads the value v of a
// key it knows and tells whether it is valid (known is false for any other
// key). values returns whether every value was valid.
func (p *parser) values(n *yaml.Node, path *ypath, read func(key string, v *yaml.Node) (valid, known bool)) bool {
	ok := true
	p.fields(n, path, func(key string, _, v *yaml.Node) bool {
		valid, known := read(key, v)
		if !known {
			return false
		}
		ok = ok && valid
		return true
	})
	return ok
}

// require reports each of keys that the mapping n lacks, and returns false
// if there was any.
func (p *parser) require(n *yaml.Node, path *ypath, keys ...string) bool {
	ok := true
	for _, key := range keys {
		if !p.has(n, path, key) {
			p.errf(n, path.k(key), "missing")
			ok = false
		}
	}
	return ok
}

// has reports whether the mapping n at path has the key key, given or
// merged.
func (p *parser) has(n *yaml.Node, path *ypath, key string) bool {
	if hasMerge(n) {
		for _, e := range p.merged(n, path) {
			if e.key == key {
				return true
			}
		}
		return false
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k := n.Content[i]; k.Tag == "!!str" && k.Value == key {
			return true
		}
	}
	return false
}

// str reads a scalar as text: envoyproxy/ratelimit reads `value: 123` as
// "123", so any scalar is accepted; an empty value is "".
func (p *parser) str(n *yaml.Node, path *ypath) (string, bool) {
	if n.Kind != yaml.ScalarNode {
		p.errf(n, path, "must be a string, not %s", kindName(n))
		return "", false
	}
	if n.Tag == "!!null" {
		return "", true
	}
	return n.Value, true
}

// boolean reads a flag as envoyproxy/ratelimit's yaml.v2 does (YAML 1.1):
// true, yes, on, y and false, no, off, n, each also capitalized or in
// capitals; empty is false. A quoted "true" is text, not a flag.
func (p *parser) boolean(n *yaml.Node, path *ypath) (bool, bool) {
	if n.Kind == yaml.ScalarNode {
		if v, ok := yaml11(n); ok {
			switch v := v.(type) {
			case nil:
				return false, true
			case bool:
				return v, true
			}
		}
	}
	p.errf(n, path, "must be true or false, not %s", kindName(n))
	return false, false
}

func (p *parser) integer(n *yaml.Node, path *ypath, min int64, minMsg string) (int64, bool) {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" {
		p.errf(n, path, "must be an integer, not %s", kindName(n))
		return 0, false
	}
	v, ok := decimal(n.Value)
	if !ok {
		// Hexadecimal, octal, binary, "_" separators: as yaml.v3 reads them.
		if err := n.Decode(&v); err != nil {
			p.errf(n, path, "must be an integer that fits 64 bits, not %q", n.Value)
			return 0, false
		}
	}
	if v < min {
		p.errf(n, path, "%s", minMsg)
		return 0, false
	}
	return v, true
}

// decimal reads a plain decimal integer ("0", "42", "-7", no leading zero,
// sign or separator) that fits 64 bits, the common case that needs no trip
// through yaml.v3's reflection; it reports false for every other text.
func decimal(s string) (int64, bool) {
	digits := s
	if len(digits) > 0 && digits[0] == '-' {
		digits = digits[1:]
	}
	if len(digits) == 0 || len(digits) > 18 || (digits[0] == '0' && len(digits) > 1) {
		return 0, false
	}
	var v int64
	for i := 0; i < len(digits); i++ {
		c := digits[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int64(c-'0')
	}
	if len(digits) < len(s) {
		v = -v
	}
	return v, true
}

// MaxPace bounds a descriptor's pace: how long a request may be held.
const MaxPace = 10 * time.Second

// pace reads a descriptor's pace: a duration in (0, MaxPace].
func (p *parser) pace(e given, path *ypath) (time.Duration, bool) {
	d, ok := p.duration(e.v, path, true)
	if !ok {
		return 0, false
	}
	if d > MaxPace {
		p.errf(e.v, path, "must be at most %s", MaxPace)
		return 0, false
	}
	return d, true
}

// duration reads a Go duration ("1s", "5m", "24h") or "unbounded"; the
// length of a window (window true) must be finite and above 0.
func (p *parser) duration(n *yaml.Node, path *ypath, window bool) (time.Duration, bool) {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		p.errf(n, path, "must be a duration such as 1s, 5m or 24h, not %s", kindName(n))
		return 0, false
	}
	if strings.EqualFold(n.Value, "unbounded") {
		if window {
			p.errf(n, path, "must be a finite duration")
			return 0, false
		}
		return tiers.Unbounded, true
	}
	d, err := time.ParseDuration(n.Value)
	if err != nil {
		hint := ""
		if _, e := strconv.ParseFloat(n.Value, 64); e == nil {
			hint = " (give a unit: " + n.Value + "s?)"
		}
		p.errf(n, path, "must be a duration such as 1s, 5m or 24h, not %q%s", n.Value, hint)
		return 0, false
	}
	if d < 0 {
		p.errf(n, path, "must be >= 0")
		return 0, false
	}
	if window && d == 0 {
		p.errf(n, path, "must be > 0")
		return 0, false
	}
	return d, true
}

// descriptors parses a descriptor list at nesting depth.
func (p *parser) descriptors(n *yaml.Node, path *ypath, depth int) []*pnode {
	if depth > maxDepth {
		p.errf(n, path, "descriptors nested deeper than %d levels", maxDepth)
		return nil
	}
	var out []*pnode
	seen := map[[2]string]int{}
	for i, it := range p.list(n, path) {
		ip := path.i(i)
		if !p.mapping(it, ip) {
			continue
		}
		d := p.descriptor(it, ip, depth)
		if d == nil {
			continue
		}
		d.index = i
		k := [2]string{d.key, d.value}
		if line, dup := seen[k]; dup {
			what := fmt.Sprintf("key %q", d.key)
			if d.value != "" {
				what += fmt.Sprintf(" value %q", d.value)
			}
			p.errf(it, ip, "duplicate descriptor: %s already at line %d", what, line)
			continue
		}
		seen[k] = d.line
		out = append(out, d)
	}
	return out
}

// policyKeys are the keys that give a descriptor its policy, in the order
// a conflict names them; amendKeys are the keys that amend that policy.
var (
	policyKeys = []string{"rate_limit", "tiers", "token_bucket", "concurrency", "copies"}
	amendKeys  = []string{"hard_limit", "global_limit", "overrides", "overdraft", "pace", "escrow"}
	// quotaKey gives a descriptor a calendar quota, beside its policy or
	// instead of one.
	quotaKey = "quota"
)

// leafSpec gathers the policy and amend keys given on one descriptor or
// override, by key.
type leafSpec map[string]given

// given is a key given (at k), with its value.
type given struct {
	name string
	k, v *yaml.Node
}

// set keeps the value v of the policy or amend key key (at k); it returns
// false for any other key. An empty rate_limit is none, as
// envoyproxy/ratelimit reads it.
func (ls leafSpec) set(key string, k, v *yaml.Node) bool {
	if !slices.Contains(policyKeys, key) && !slices.Contains(amendKeys, key) && key != quotaKey {
		return false
	}
	if key == "rate_limit" && v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
		return true
	}
	ls[key] = given{key, k, v}
	return true
}

// pick returns the keys of names that were given, in the order of names.
func (ls leafSpec) pick(names ...string) []given {
	var gs []given
	for _, name := range names {
		if g, ok := ls[name]; ok {
			gs = append(gs, g)
		}
	}
	return gs
}

func (p *parser) descriptor(n *yaml.Node, path *ypath, depth int) *pnode {
	d := &pnode{line: n.Line}
	ls := leafSpec{}
	var children *yaml.Node
	var keyNode *yaml.Node
	var shadow, detailed, quota bool
	var metadata map[string]any
	p.fields(n, path, func(key string, k, v *yaml.Node) bool {
		fp := path.k(key)
		switch key {
		case "key":
			keyNode = k
			d.key, _ = p.str(v, fp)
		case "value":
			d.value, _ = p.str(v, fp)
		case "descriptors":
			children = v
		case "shadow_mode":
			shadow, _ = p.boolean(v, fp)
		case "detailed_metric":
			detailed, _ = p.boolean(v, fp)
		case "value_to_metric":
			d.node.ValueToMetric, _ = p.boolean(v, fp)
		case "share_threshold":
			d.node.ShareThreshold, _ = p.boolean(v, fp)
		case "quota_mode":
			quota, _ = p.boolean(v, fp)
		case "metadata":
			// Reported back to Envoy in a response's dynamic metadata
			// (--dynamic-metadata), as envoyproxy/ratelimit does.
			metadata = p.metadata(v, fp)
		default:
			return ls.set(key, k, v)
		}
		return true
	})
	if d.key == "" {
		p.errf(cmp.Or(keyNode, n), path.k("key"), "descriptor has an empty key")
	}
	d.node.Key, d.node.Value = d.key, d.value
	d.node.DetailedMetric = detailed
	if l := p.limit(ls, path, n.Line); l != nil {
		l.ShadowMode = shadow
		l.QuotaMode = quota
		l.Metadata = metadata
		l.DetailedMetric = detailed
		l.File, l.Line = p.file, n.Line
		if p.opts.Generated {
			l.Line = 0
		}
		d.node.Limit = l
	}
	if d.node.ShareThreshold && d.value != "" && !strings.Contains(d.value, "*") {
		p.warnf(n, path.k("share_threshold"), "has no effect on a fixed value")
	}
	if children != nil {
		d.children = p.descriptors(children, path.k("descriptors"), depth+1)
	}
	if d.key == "" {
		return nil
	}
	return d
}

// metadata reads a descriptor's metadata as envoyproxy/ratelimit does
// (yaml.v2 into a map[string]interface{}, then a protobuf Struct): scalars
// resolved as YAML 1.1 (yes is true, a date stays text), the keys of the
// mapping itself as their text, those of nested mappings as the text of
// their value (429, true, 1.5, <nil>), merge keys expanded. Empty is none.
func (p *parser) metadata(n *yaml.Node, path *ypath) map[string]any {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	if !p.mapping(n, path) {
		return nil
	}
	m, ok := p.metaMap(n, path, nil, true)
	if !ok || len(m) == 0 {
		return nil
	}
	return m
}

// metaMap reads the mapping n of metadata, within the mappings and lists
// outer; top is the metadata mapping itself.
func (p *parser) metaMap(n *yaml.Node, path *ypath, outer []*yaml.Node, top bool) (map[string]any, bool) {
	before := len(p.errs)
	pairs := p.expand(n, path, false, func(k *yaml.Node) (string, bool) {
		if k = p.resolve(k); k == nil {
			return "", false
		}
		if k.Kind != yaml.ScalarNode {
			p.errf(k, path, "a key must be a scalar, not %s", kindName(k))
			return "", false
		}
		v, ok := p.metaScalar(k, path)
		if !ok {
			return "", false
		}
		s, text := v.(string)
		switch {
		case top && v == nil:
			return "", true
		case top && !text:
			return k.Value, true
		case !text:
			return fmt.Sprint(v), true
		}
		return s, true
	})
	m := make(map[string]any, len(pairs))
	outer = append(outer, n)
	for _, e := range pairs {
		m[e.key], _ = p.metaValue(e.v, path.k(e.key), outer)
	}
	return m, len(p.errs) == before
}

// metaValue reads the value n of metadata, within the mappings and lists
// outer.
func (p *parser) metaValue(n *yaml.Node, path *ypath, outer []*yaml.Node) (any, bool) {
	if n.Kind == yaml.ScalarNode {
		return p.metaScalar(n, path)
	}
	if slices.Contains(outer, n) {
		p.errf(n, path, "contains itself (an alias inside its own anchor)")
		return nil, false
	}
	if len(outer) >= maxDepth {
		p.errf(n, path, "nested deeper than %d levels", maxDepth)
		return nil, false
	}
	if n.Kind == yaml.MappingNode {
		return p.metaMap(n, path, outer, false)
	}
	l := make([]any, 0, len(n.Content))
	ok := true
	outer = append(outer, n)
	for i, it := range n.Content {
		if it = p.resolve(it); it == nil {
			return nil, false
		}
		v, vok := p.metaValue(it, path.i(i), outer)
		l = append(l, v)
		ok = ok && vok
	}
	return l, ok
}

// metaScalar is yaml11 with its refusals reported, and text that a
// protobuf Struct cannot hold (not UTF-8) refused.
func (p *parser) metaScalar(n *yaml.Node, path *ypath) (any, bool) {
	v, ok := yaml11(n)
	if !ok {
		p.errf(n, path, "%q is not a valid %s", n.Value, strings.TrimPrefix(n.Tag, "!!"))
		return nil, false
	}
	if s, text := v.(string); text && !utf8.ValidString(s) {
		p.errf(n, path, "not valid UTF-8")
		return nil, false
	}
	return v, true
}

// calendarUnits parses a file's calendar_units: an IANA time zone, whose
// calendar the units day, week, month and year then follow, or off (nil).
func (p *parser) calendarUnits(v *yaml.Node, path *ypath) (*time.Location, bool) {
	s, ok := p.str(v, path)
	if !ok {
		return nil, false
	}
	if strings.EqualFold(s, "off") {
		return nil, true
	}
	loc, err := time.LoadLocation(s)
	if err != nil || s == "" || s == "Local" {
		p.errf(v, path, "unknown time zone %q (want an IANA name such as Europe/Paris, UTC, or off)", s)
		return nil, false
	}
	return loc, true
}
