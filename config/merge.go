package config

import (
	"fmt"
	"time"

	"github.com/charonlimit/charon/descriptors"
)

// merge groups the parsed files by RLS domain: a domain in several files is
// an error unless Options.MergeDomains, which appends their top-level
// descriptors in file order (a key and value given twice is an error, as in
// envoyproxy/ratelimit) and sets ignore_limits or allow_unconfigured when any
// of the files sets it.
func (st *state) merge(files []*fileConfig) []descriptors.DomainSpec {
	type domain struct {
		first *fileConfig
		spec  descriptors.DomainSpec
		seen  map[[2]string]at
	}
	byName := map[string]*domain{}
	var order []*domain
	for _, fc := range files {
		d := byName[fc.domain]
		if d == nil {
			d = &domain{first: fc, seen: map[[2]string]at{}, spec: descriptors.DomainSpec{Config: descriptors.DomainConfig{Name: fc.domain}}}
			byName[fc.domain] = d
			order = append(order, d)
		} else if !st.opts.MergeDomains {
			st.errs = append(st.errs, &Error{File: fc.file, Line: fc.line, Path: "domain",
				Message: fmt.Sprintf("duplicate domain %q: already defined in %s:%d (enable domain merging to merge them)", fc.domain, d.first.file, d.first.line)})
			continue
		}
		if d.first == fc {
			d.spec.Config.CalendarUnits = fc.calendar
		} else if zoneName(fc.calendar) != zoneName(d.first.calendar) {
			// A request's own limit in the domain follows one calendar.
			st.errs = append(st.errs, &Error{File: fc.file, Line: max(fc.calendarLine, fc.line), Path: "calendar_units",
				Message: fmt.Sprintf("calendar units %s, but %s in %s:%d of the same domain", zoneName(fc.calendar), zoneName(d.first.calendar), d.first.file, d.first.line)})
		}
		d.spec.Config.IgnoreLimits = d.spec.Config.IgnoreLimits || fc.ignoreLimits
		d.spec.Config.AllowUnconfigured = d.spec.Config.AllowUnconfigured || fc.allowUnconfigured
		for _, n := range fc.nodes {
			k := [2]string{n.key, n.value}
			if at, dup := d.seen[k]; dup {
				st.errs = append(st.errs, &Error{File: fc.file, Line: n.line, Path: rootPath("descriptors").i(n.index).String(),
					Message: fmt.Sprintf("duplicate descriptor: key %q value %q already at %s:%d", n.key, n.value, at.file, at.line)})
				continue
			}
			d.seen[k] = at{fc.file, n.line}
			d.spec.Nodes = append(d.spec.Nodes, build(n))
		}
	}
	specs := make([]descriptors.DomainSpec, len(order))
	for i, d := range order {
		specs[i] = d.spec
	}
	return specs
}

// at is where a descriptor was first given.
type at struct {
	file string
	line int
}

func build(n *pnode) *descriptors.Node {
	out := n.node
	for _, c := range n.children {
		out.Children = append(out.Children, build(c))
	}
	return &out
}

// zoneName is a calendar units' zone as a file writes it: off for none.
func zoneName(loc *time.Location) string {
	if loc == nil {
		return "off"
	}
	return loc.String()
}
