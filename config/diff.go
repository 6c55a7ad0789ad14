package config

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/tiers"
)

// Kinds of a RuleChange and a DomainChange.
const (
	Added   = "added"
	Removed = "removed"
	Changed = "changed"
)

// Diff is the semantic difference between two configurations, old and
// new: what a reload from one to the other changes for requests. Its
// parts are sorted; an empty Diff (Empty) means the two decide alike.
type Diff struct {
	Domains []DomainChange `json:"domains"`
	Rules   []RuleChange   `json:"rules"`
	Moved   []Moved        `json:"moved"`
}

// DomainChange is an RLS domain added, removed, or whose settings changed.
type DomainChange struct {
	Kind    string        `json:"kind"`
	Domain  string        `json:"domain"`
	Changes []FieldChange `json:"changes,omitempty"`
}

// RuleChange is a rule (a descriptor of the configuration that carries a
// limit) added, removed, or changed. A rule is identified by its RLS
// domain and its path of keys and configured values (Descriptor, as
// "path=/login,remote_address": a key alone matches any value, a value
// with "*" is a wildcard), that is by its resource.
type RuleChange struct {
	Kind       string `json:"kind"`
	Domain     string `json:"domain"`
	Descriptor string `json:"descriptor"`
	Resource   string `json:"resource"`
	// OldLimit and NewLimit describe the limit on each side ("" on the
	// side where the rule does not exist); OldSource and NewSource are its
	// file:line.
	OldLimit  string `json:"old_limit,omitempty"`
	NewLimit  string `json:"new_limit,omitempty"`
	OldSource string `json:"old_source,omitempty"`
	NewSource string `json:"new_source,omitempty"`
	// Changes lists, for a changed rule, each setting that differs.
	Changes []FieldChange `json:"changes,omitempty"`
}

// FieldChange is one setting's old and new value.
type FieldChange struct {
	Field string `json:"field"`
	Old   string `json:"old"`
	New   string `json:"new"`
}

// Moved is a descriptor that both configurations limit, but by different
// rules: its requests change state and limit. Descriptor is written like
// RuleChange's (a key alone stands for a value that no other rule names).
type Moved struct {
	Domain     string `json:"domain"`
	Descriptor string `json:"descriptor"`
	// From and To are the matched rules' descriptors.
	From string `json:"from"`
	To   string `json:"to"`
}

// Empty reports whether d has no change.
func (d *Diff) Empty() bool { return len(d.Domains) == 0 && len(d.Rules) == 0 && len(d.Moved) == 0 }

// Compare returns the semantic difference from old to new: RLS domains
// and rules added and removed, rules whose limit or settings changed (old
// and new values), and descriptors that both limit through different rules.
// The descriptors checked for Moved are the rules' own paths of either
// side, a wildcard or a key alone standing for a value no other rule names.
// A nil Config is an empty one.
func Compare(old, new *Config) *Diff {
	var ot, nt *descriptors.Tree
	if old != nil {
		ot = old.Tree
	}
	if new != nil {
		nt = new.Tree
	}
	d := &Diff{Domains: []DomainChange{}, Rules: []RuleChange{}, Moved: []Moved{}}
	names := map[string]bool{}
	for _, dc := range ot.Domains() {
		names[dc.Name] = true
	}
	for _, dc := range nt.Domains() {
		names[dc.Name] = true
	}
	for _, name := range sortedKeys(names) {
		oc, inOld := ot.Domain(name)
		nc, inNew := nt.Domain(name)
		switch {
		case !inNew:
			d.Domains = append(d.Domains, DomainChange{Kind: Removed, Domain: name})
		case !inOld:
			d.Domains = append(d.Domains, DomainChange{Kind: Added, Domain: name})
		default:
			var fs []FieldChange
			fs = field(fs, "ignore_limits", fmt.Sprint(oc.IgnoreLimits), fmt.Sprint(nc.IgnoreLimits))
			fs = field(fs, "allow_unconfigured", fmt.Sprint(oc.AllowUnconfigured), fmt.Sprint(nc.AllowUnconfigured))
			fs = field(fs, "calendar_units", zoneName(oc.CalendarUnits), zoneName(nc.CalendarUnits))
			if len(fs) > 0 {
				d.Domains = append(d.Domains, DomainChange{Kind: Changed, Domain: name, Changes: fs})
			}
		}
		d.Rules = append(d.Rules, compareRules(name, ot.Leaves(name), nt.Leaves(name))...)
		if inOld && inNew {
			d.Moved = append(d.Moved, moved(name, ot, nt)...)
		}
	}
	return d
}

func field(fs []FieldChange, name, old, new string) []FieldChange {
	if old == new {
		return fs
	}
	return append(fs, FieldChange{Field: name, Old: old, New: new})
}

func compareRules(domain string, old, new []descriptors.Leaf) []RuleChange {
	byRes := func(ls []descriptors.Leaf) map[string]*descriptors.Leaf {
		m := make(map[string]*descriptors.Leaf, len(ls))
		for i := range ls {
			m[ls[i].Resource] = &ls[i]
		}
		return m
	}
	om, nm := byRes(old), byRes(new)
	var out []RuleChange
	for _, lf := range old {
		n := nm[lf.Resource]
		r := RuleChange{Domain: domain, Descriptor: PathString(lf.Path), Resource: lf.Resource,
			OldLimit: DescribeLimit(lf.Limit), OldSource: source(lf.Limit)}
		if n == nil {
			r.Kind = Removed
			out = append(out, r)
			continue
		}
		r.NewLimit, r.NewSource = DescribeLimit(n.Limit), source(n.Limit)
		if fs := limitFields(lf.Limit, n.Limit); len(fs) > 0 {
			r.Kind, r.Changes = Changed, fs
			out = append(out, r)
		}
	}
	for _, lf := range new {
		if om[lf.Resource] == nil {
			out = append(out, RuleChange{Kind: Added, Domain: domain, Descriptor: PathString(lf.Path), Resource: lf.Resource,
				NewLimit: DescribeLimit(lf.Limit), NewSource: source(lf.Limit)})
		}
	}
	slices.SortFunc(out, func(a, b RuleChange) int { return strings.Compare(a.Resource, b.Resource) })
	return out
}

func source(l *descriptors.Limit) string { return l.Where() }

// limitFields lists the settings of two limits that differ; the source
// lines are not settings.
func limitFields(a, b *descriptors.Limit) []FieldChange {
	var fs []FieldChange
	fs = field(fs, "limit", DescribePolicy(a.Policy), DescribePolicy(b.Policy))
	fs = field(fs, "quota", DescribePolicy(a.Quota), DescribePolicy(b.Quota))
	fs = field(fs, "unlimited", fmt.Sprint(a.Unlimited), fmt.Sprint(b.Unlimited))
	fs = field(fs, "shadow_mode", fmt.Sprint(a.ShadowMode), fmt.Sprint(b.ShadowMode))
	fs = field(fs, "quota_mode", fmt.Sprint(a.QuotaMode), fmt.Sprint(b.QuotaMode))
	fs = field(fs, "name", a.Name, b.Name)
	fs = field(fs, "replaces", strings.Join(a.Replaces, ","), strings.Join(b.Replaces, ","))
	fs = field(fs, "copies", describeCopies(a.Copies), describeCopies(b.Copies))
	doms := map[string]bool{}
	for k := range a.Overrides {
		doms[k] = true
	}
	for k := range b.Overrides {
		doms[k] = true
	}
	for _, k := range sortedKeys(doms) {
		fs = field(fs, "overrides["+k+"]", DescribePolicy(a.Overrides[k]), DescribePolicy(b.Overrides[k]))
	}
	return fs
}

// moved finds the descriptors of either side's rule paths that both trees
// limit through different rules.
func moved(domain string, ot, nt *descriptors.Tree) []Moved {
	seen := map[string]bool{}
	var out []Moved
	for _, ls := range [][]descriptors.Leaf{ot.Leaves(domain), nt.Leaves(domain)} {
		for _, lf := range ls {
			desc := PathString(lf.Path)
			if seen[desc] {
				continue
			}
			seen[desc] = true
			entries := make([]descriptors.Entry, len(lf.Path))
			for i, e := range lf.Path {
				// A key alone or a wildcard stands for a value that no
				// rule names: "*" itself, which only a pattern of "*"s
				// and the pattern itself match exactly.
				entries[i] = descriptors.Entry{Key: e.Key, Value: e.Value}
				if e.Value == "" {
					entries[i].Value = "*"
				}
			}
			om, ok1 := ot.Match(domain, entries)
			nm, ok2 := nt.Match(domain, entries)
			if ok1 && ok2 && om.Resource != nm.Resource {
				out = append(out, Moved{Domain: domain, Descriptor: desc, From: leafPath(ot, domain, om.Resource), To: leafPath(nt, domain, nm.Resource)})
			}
		}
	}
	slices.SortFunc(out, func(a, b Moved) int { return strings.Compare(a.Descriptor, b.Descriptor) })
	return out
}

func leafPath(t *descriptors.Tree, domain, resource string) string {
	for _, lf := range t.Leaves(domain) {
		if lf.Resource == resource {
			return PathString(lf.Path)
		}
	}
	return resource
}

// PathString writes a rule's path as a descriptor: "k=v,k2" (a key
// alone matches any value; a value with "*" is a wildcard).
func PathString(path []descriptors.Entry) string {
	var b strings.Builder
	for i, e := range path {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(e.Key)
		if e.Value != "" {
			b.WriteByte('=')
			b.WriteString(e.Value)
		}
	}
	return b.String()
}

// DescribeLimit says what a rule's limit is in a few words: "unlimited",
// "copies: …", or its policy (DescribePolicy), with the modes that change
// its answers.
func DescribeLimit(l *descriptors.Limit) string {
	if l == nil {
		return "none"
	}
	var s string
	switch {
	case l.Unlimited:
		s = "unlimited"
	case l.Copies != nil:
		s = describeCopies(l.Copies)
	case l.Policy == nil && l.Quota != nil:
		s = DescribePolicy(l.Quota)
	default:
		s = DescribePolicy(l.Policy)
		if l.Quota != nil {
			s += "; " + DescribePolicy(l.Quota)
		}
	}
	if len(l.Overrides) > 0 {
		s += fmt.Sprintf(" (%d overrides)", len(l.Overrides))
	}
	if l.ShadowMode {
		s += ", shadow"
	}
	if l.QuotaMode {
		s += ", quota"
	}
	return s
}

// DescribePolicy says what a policy limits in a few words: "5 per 1s",
// "5 per 1s, then 10 per 1s for 5s (cooldown 15s)", "fixed 100 per
// minute", "bucket 100, 10 per 1s", "10 in flight, ttl 5m", "rejects
// all"; "none" for nil.
func DescribePolicy(p *tiers.Policy) string {
	if p == nil {
		return "none"
	}
	if p.Concurrency && len(p.Tiers) == 1 {
		return fmt.Sprintf("%d in flight, ttl %s", p.Tiers[0].Limit, fmtDur(p.Tiers[0].Window))
	}
	var b strings.Builder
	switch p.Kind {
	case tiers.KindTokenBucket:
		fmt.Fprintf(&b, "bucket %d, %d per %s", p.Bucket.Capacity, p.Bucket.Refill, fmtDur(p.Bucket.Per))
	case tiers.KindFixedWindow:
		fmt.Fprintf(&b, "fixed %d per %s", p.Window.Limit, p.Window.Unit)
	case tiers.KindQuota:
		q := &p.Quota
		fmt.Fprintf(&b, "quota %d per %s", q.Limit, q.Period)
		if q.Location != nil && q.Location != time.UTC {
			fmt.Fprintf(&b, " in %s", q.Location)
		}
		if !q.Anchor.IsZero() {
			fmt.Fprintf(&b, " from %s", q.Anchor.UTC().Format(time.RFC3339))
		}
	default:
		if len(p.Tiers) == 0 {
			b.WriteString("rejects all")
		}
		for i, t := range p.Tiers {
			if i > 0 {
				b.WriteString(", then ")
			}
			fmt.Fprintf(&b, "%d per %s", t.Limit, fmtDur(t.Window))
			if t.Active != tiers.Unbounded || t.Cooldown != 0 {
				fmt.Fprintf(&b, " for %s", fmtDur(t.Active))
				if t.Cooldown != 0 {
					fmt.Fprintf(&b, " (cooldown %s)", fmtDur(t.Cooldown))
				}
			}
			if t.Skippable {
				b.WriteString(" skippable")
			}
		}
		if p.HardLimit > 0 {
			fmt.Fprintf(&b, ", hard %d/s", p.HardLimit)
		}
		if p.GlobalLimit > 0 {
			fmt.Fprintf(&b, ", global %d/s", p.GlobalLimit)
		}
	}
	if p.Overdraft {
		b.WriteString(", post-paid")
	}
	return b.String()
}

func describeCopies(c *descriptors.Copies) string {
	if c == nil {
		return "none"
	}
	s := fmt.Sprintf("copies %d per domain", c.DomainLimit)
	if c.GlobalLimit > 0 {
		s += fmt.Sprintf(", %d in all", c.GlobalLimit)
	}
	for _, g := range c.Groups {
		s += fmt.Sprintf(", group %s %d", g.Name, g.Limit)
	}
	for _, d := range sortedKeys(c.Overrides) {
		s += fmt.Sprintf(", %s %d", d, c.Overrides[d])
	}
	return s
}
