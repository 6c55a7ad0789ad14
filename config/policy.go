package config

import (
	"cmp"
	"errors"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/tiers"
)

// closed is the policy that rejects every request (no tiers).
func closed() *tiers.Policy { return &tiers.Policy{Kind: tiers.KindTiers} }

// banned reports whether p is a rate_limit of requests_per_unit 0, which
// rejects every request whatever else the descriptor says.
func banned(p *tiers.Policy) bool {
	return p != nil && p.Kind == tiers.KindFixedWindow && p.Window.Limit == 0
}

// limit builds the limit of one descriptor, nil when it has none (or on
// error, already reported).
func (p *parser) limit(ls leafSpec, path *ypath, line int) *descriptors.Limit {
	gs := ls.pick(policyKeys...)
	if qg, set := ls[quotaKey]; set && len(gs) == 0 {
		return p.quotaOnly(ls, qg, path)
	}
	if len(gs) == 0 {
		for _, g := range ls.pick(amendKeys...) {
			p.errf(g.k, path.k(g.name), "needs a policy on the same descriptor (rate_limit, tiers, token_bucket, concurrency or copies)")
		}
		return nil
	}
	if len(gs) > 1 {
		p.errf(gs[1].k, path.k(gs[1].name), "a descriptor has exactly one policy: %s and %s both given", gs[0].name, gs[1].name)
		return nil
	}
	g := gs[0]
	gp := path.k(g.name)
	l := &descriptors.Limit{}
	ok := true
	switch g.name {
	case "rate_limit":
		var meta rlMeta
		l.Policy, meta, ok = p.rateLimit(g.v, gp, true)
		l.Name, l.Replaces, l.Unlimited = meta.name, meta.replaces, meta.unlimited
	case "tiers":
		l.Policy, ok = p.tierList(g.k, g.v, gp)
	case "token_bucket":
		l.Policy, ok = p.tokenBucket(g.v, gp)
	case "concurrency":
		l.Policy, ok = p.concurrency(g.v, gp)
	case "copies":
		l.Copies, ok = p.copies(g.v, gp)
	}
	if !ok {
		return nil
	}
	conc := l.Policy != nil && l.Policy.Concurrency
	if conc {
		// What a concurrency limit is not: hits per second, post-paid,
		// paced, a calendar quota (a stream-done refund would give the
		// quota's calls back with the slots).
		for _, e := range ls.pick("hard_limit", "global_limit", "overdraft", "pace", quotaKey) {
			p.errf(e.k, path.k(e.name), "does not apply to a concurrency limit (concurrency counts requests in flight)")
			ok = false
		}
		if !ok {
			return nil
		}
	}
	for _, e := range ls.pick("hard_limit", "global_limit") {
		ep := path.k(e.name)
		if banned(l.Policy) {
			p.warnf(e.k, ep, "ignored: requests_per_unit 0 rejects every request")
			continue
		}
		if l.Policy == nil || l.Policy.Kind != tiers.KindTiers {
			p.errf(e.k, ep, "applies only to tiers and to a sliding-window rate_limit")
			ok = false
			continue
		}
		v, vok := p.integer(e.v, ep, 1, "must be >= 1 (leave it out for no limit)")
		if !vok {
			ok = false
		} else if e.name == "hard_limit" {
			l.Policy.HardLimit = v
		} else {
			l.Policy.GlobalLimit = v
		}
	}
	if o, set := ls["overrides"]; set {
		op := path.k("overrides")
		if l.Unlimited {
			p.errf(o.k, op, "an unlimited rate_limit has no overrides")
			ok = false
		} else if !p.overrides(o.v, op, l) {
			ok = false
		}
	}
	od := p.opts.OverdraftDefault
	if e, set := ls["overdraft"]; set {
		v, vok := p.boolean(e.v, path.k("overdraft"))
		switch {
		case !vok:
			ok = false
		case l.Policy == nil:
			p.errf(e.k, path.k("overdraft"), "applies only to a rate_limit, tiers or token_bucket that limits")
			ok = false
		default:
			od = v
		}
	}
	if l.Policy != nil && !conc {
		// Post-paid counting: every policy of the descriptor, its
		// overrides' too. Never a concurrency limit's, whatever the
		// server's default: a slot is held before the request runs.
		l.Policy.Overdraft = od
		for _, o := range l.Overrides {
			o.Overdraft = od
		}
	}
	if e, set := ls["pace"]; set {
		if l.Policy == nil || l.Unlimited {
			p.errf(e.k, path.k("pace"), "applies only to a rate_limit, tiers, token_bucket or quota that limits")
			ok = false
		} else if d, dok := p.pace(e, path.k("pace")); dok {
			l.Pace = d
		} else {
			ok = false
		}
	}
	if l.Policy != nil && !p.validate(g.k, path, g.name, l.Policy) {
		ok = false
	}
	if e, set := ls["pace"]; set && ok && l.Pace > 0 {
		// Only what package tiers can reserve exactly (tiers.CanPace): the
		// descriptor's policy and every override's.
		pols := []*tiers.Policy{l.Policy}
		for _, o := range l.Overrides {
			pols = append(pols, o)
		}
		for _, pol := range pols {
			if err := tiers.CanPace(pol); err != nil {
				p.errf(e.k, path.k("pace"), "%s", strings.TrimPrefix(err.Error(), "tiers: "))
				ok = false
				break
			}
		}
	}
	if e, set := ls["escrow"]; set {
		ep := path.k("escrow")
		v, vok := p.boolean(e.v, ep)
		switch {
		case !vok:
			ok = false
		case l.Policy == nil || l.Unlimited:
			p.errf(e.k, ep, "applies only to a rate_limit, tiers or token_bucket that limits")
			ok = false
		case v:
			l.Escrow = descriptors.EscrowOn
		default:
			l.Escrow = descriptors.EscrowOff
		}
	}
	if ok {
		p.escrowNotes(g.k, path, l)
	}
	if qg, set := ls[quotaKey]; set {
		if l.Copies != nil {
			p.errf(qg.k, path.k(quotaKey), "a copy-limited resource has no quota")
			ok = false
		} else if q, qok := p.quota(qg, path, od); qok {
			l.Quota = q
		} else {
			ok = false
		}
	}
	if l.Copies != nil && l.Copies.GlobalLimit > 0 {
		p.lowerCopies(g.v, gp, l.Copies)
	}
	if !ok {
		return nil
	}
	return l
}

// quotaOnly builds the limit of a descriptor whose only limit is a
// calendar quota.
func (p *parser) quotaOnly(ls leafSpec, qg given, path *ypath) *descriptors.Limit {
	ok := true
	for _, g := range ls.pick(amendKeys...) {
		if g.name != "overdraft" {
			p.errf(g.k, path.k(g.name), "needs a rate policy on the same descriptor (rate_limit, tiers or token_bucket)")
			ok = false
		}
	}
	od := p.opts.OverdraftDefault
	if e, set := ls["overdraft"]; set {
		v, vok := p.boolean(e.v, path.k("overdraft"))
		ok = ok && vok
		od = v
	}

	q, qok := p.quota(qg, path, od)
	if !ok || !qok {
		return nil
	}
	return &descriptors.Limit{Quota: q}
}

// quota parses a calendar quota: {limit, period, time_zone, anchor}.
func (p *parser) quota(g given, base *ypath, overdraft bool) (*tiers.Policy, bool) {
	path := base.k(quotaKey)
	if !p.mapping(g.v, path) {
		return nil, false
	}
	pol := &tiers.Policy{Kind: tiers.KindQuota, Overdraft: overdraft}
	q := &pol.Quota
	var anchor string
	ok := p.values(g.v, path, func(key string, v *yaml.Node) (valid, known bool) {
		switch key {
		case "limit":
			q.Limit, valid = p.integer(v, path.k(key), 1, "must be >= 1")
		case "period":
			s, sok := p.str(v, path.k(key))
			if !sok {
				return false, true
			}
			if q.Period, valid = tiers.ParsePeriod(s); !valid {
				p.errf(v, path.k(key), "unknown period %q (want minute, hour, day, week, month, quarter or year)", s)
			}
		case "time_zone":
			s, sok := p.str(v, path.k(key))
			if !sok {
				return false, true
			}
			loc, err := time.LoadLocation(s)
			if err != nil || s == "" || s == "Local" {
				p.errf(v, path.k(key), "unknown time zone %q (want an IANA name such as Europe/Paris)", s)
				return false, true
			}
			q.Location, valid = loc, true
		case "anchor":
			anchor, valid = p.str(v, path.k(key))
			if valid {
				a, err := time.Parse(time.RFC3339Nano, anchor)
				if err != nil {
					p.errf(v, path.k(key), "must be an RFC 3339 instant such as 2025-01-31T00:00:00-05:00")
					return false, true
				}
				q.Anchor = a
			}
		default:
			return false, false
		}
		return valid, true
	})
	if !p.require(g.v, path, "limit", "period") || !ok {
		return nil, false
	}
	if !p.validate(g.k, base, quotaKey, pol) {
		return nil, false
	}
	return pol, true
}

// concurrency parses a concurrency limit: {limit, ttl}, one tier of limit
// slots that live ttl unless a refund gives them back first.
func (p *parser) concurrency(n *yaml.Node, path *ypath) (*tiers.Policy, bool) {
	if !p.mapping(n, path) {
		return nil, false
	}
	t := tiers.Tier{Active: tiers.Unbounded}
	ok := p.values(n, path, func(key string, v *yaml.Node) (valid, known bool) {
		switch key {
		case "limit":
			t.Limit, valid = p.integer(v, path.k(key), 1, "must be >= 1")
		case "ttl":
			t.Window, valid = p.duration(v, path.k(key), true)
		default:
			return false, false
		}
		return valid, true
	})
	pol := &tiers.Policy{Kind: tiers.KindTiers, Concurrency: true, Tiers: []tiers.Tier{t}}
	return pol, p.require(n, path, "limit", "ttl") && ok
}

var tierNote = regexp.MustCompile(`^tiers\[(\d+)\]: (.*)$`)

// rateLimitFields maps tiers.FieldError fields of a policy built from a
// rate_limit block back to that block's keys.
var rateLimitFields = map[string]string{
	"tiers[0].limit":    "rate_limit.requests_per_unit",
	"tiers[0].window":   "rate_limit.unit",
	"requests_per_unit": "rate_limit.requests_per_unit",
	"unit":              "rate_limit.unit",
}

// concurrencyFields maps tiers.FieldError fields of a policy built from a
// concurrency block back to that block's keys.
var concurrencyFields = map[string]string{
	"tiers[0].limit":  "concurrency.limit",
	"tiers[0].window": "concurrency.ttl",
}

// validate applies tiers.Validate to a finished policy built from the key
// source (rate_limit, tiers, token_bucket) of the descriptor or override at
// base, reporting the field it names.
func (p *parser) validate(at *yaml.Node, base *ypath, source string, pol *tiers.Policy) bool {
	err := tiers.Validate(pol)
	if err == nil {
		return true
	}
	var fe *tiers.FieldError
	if !errors.As(err, &fe) {
		p.errf(at, base.k(source), "%v", err)
		return false
	}
	field := fe.Field
	switch source {
	case "rate_limit":
		if f, ok := rateLimitFields[field]; ok {
			field = f
		}
	case "concurrency":
		if f, ok := concurrencyFields[field]; ok {
			field = f
		}
	}
	p.errf(at, base.k(field), "%s", fe.Problem)
	return false
}

type rlMeta struct {
	name      string
	replaces  []string
	unlimited bool
}

// rateLimit parses envoyproxy/ratelimit's rate_limit block; full allows
// name, replaces and unlimited (not in overrides).
func (p *parser) rateLimit(n *yaml.Node, path *ypath, full bool) (*tiers.Policy, rlMeta, bool) {
	var meta rlMeta
	if !p.mapping(n, path) {
		return nil, meta, false
	}
	var unitNode, rpuNode, algNode, replNode *yaml.Node
	var unit string
	ok := true
	p.fields(n, path, func(key string, k, v *yaml.Node) bool {
		fp := path.k(key)
		switch key {
		case "unit":
			unitNode = v
			unit, _ = p.str(v, fp)
		case "requests_per_unit":
			rpuNode = v
		case "algorithm":
			algNode = v
		case "unlimited", "name", "replaces":
			if !full {
				return false
			}
			switch key {
			case "unlimited":
				meta.unlimited, _ = p.boolean(v, fp)
			case "name":
				meta.name, _ = p.str(v, fp)
			case "replaces":
				replNode = v
			}
		default:
			return false
		}
		return true
	})
	if replNode != nil {
		for i, it := range p.list(replNode, path.k("replaces")) {
			ip := path.k("replaces").i(i)
			if !p.mapping(it, ip) {
				ok = false
				continue
			}
			var name string
			p.fields(it, ip, func(key string, k, v *yaml.Node) bool {
				if key != "name" {
					return false
				}
				name, _ = p.str(v, ip.k("name"))
				return true
			})
			switch {
			case name == "":
				p.errf(it, ip.k("name"), "empty replaces entry")
				ok = false
			case name == meta.name:
				p.errf(it, ip.k("name"), "a limit cannot replace its own name %q", name)
				ok = false
			default:
				meta.replaces = append(meta.replaces, name)
			}
		}
	}
	u, validUnit := tiers.ParseUnit(unit)
	if meta.unlimited {
		if validUnit {
			p.errf(unitNode, path.k("unit"), "unit given with unlimited: true")
			return nil, meta, false
		}
		if unitNode != nil || rpuNode != nil || algNode != nil {
			p.warnf(n, path, "unlimited: true ignores unit, requests_per_unit and algorithm")
		}
		return nil, meta, ok
	}
	if !validUnit {
		p.errf(cmp.Or(unitNode, n), path.k("unit"), "invalid rate limit unit %q: use second, minute, hour, day, week, month or year", unit)
		ok = false
	}
	var rpu int64
	if rpuNode != nil && rpuNode.Kind == yaml.ScalarNode && rpuNode.Tag == "!!null" {
		// envoyproxy/ratelimit reads an empty requests_per_unit as 0.
		p.warnf(rpuNode, path.k("requests_per_unit"), "empty: 0, every request is rejected")
	} else if rpuNode != nil {
		var rok bool
		rpu, rok = p.integer(rpuNode, path.k("requests_per_unit"), 0, "must be >= 0")
		ok = ok && rok
		if rok && rpu > 1<<32-1 {
			p.errf(rpuNode, path.k("requests_per_unit"), "must be < 2^32")
			ok = false
		}
	}
	fixed := p.opts.FixedWindowDefault
	if algNode != nil {
		alg, _ := p.str(algNode, path.k("algorithm"))
		switch strings.ToLower(alg) {
		case "fixed_window", "fixed":
			fixed = true
		case "sliding_window", "sliding":
			fixed = false
		default:
			p.errf(algNode, path.k("algorithm"), "unknown algorithm %q: use sliding_window or fixed_window", alg)
			ok = false
		}
	}
	if !ok {
		return nil, meta, false
	}
	if per, cal := u.CalendarPeriod(); cal && p.calendar != nil && rpu > 0 {
		// Calendar units: a day, week, month or year of the zone's clock,
		// counted as a quota of that period, in either algorithm.
		return &tiers.Policy{Kind: tiers.KindQuota, Quota: tiers.Quota{Limit: rpu, Period: per, Location: p.calendar}}, meta, true
	}
	if fixed || rpu == 0 {
		// A limit of 0 bans the descriptor in either algorithm (no window
		// grants anything); as a fixed window of 0 it answers as
		// envoyproxy/ratelimit does: its name, 0 per its unit, the rest of
		// the unit's window as the reset.
		return &tiers.Policy{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Limit: rpu, Unit: u}}, meta, true
	}
	// A sliding window of the unit's length (a month is 30 days, a year 365).
	return &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: rpu, Window: u.Length(), Active: tiers.Unbounded}}}, meta, true
}

// tierList parses tiers: [{limit, window, active, cooldown, skippable}] and
// normalizes them (SPEC §2), warning for each change.
func (p *parser) tierList(k, n *yaml.Node, path *ypath) (*tiers.Policy, bool) {
	pol := closed()
	ok := true
	items := p.list(n, path)
	for i, it := range items {
		ip := path.i(i)
		if !p.mapping(it, ip) {
			ok = false
			continue
		}
		t := tiers.Tier{Active: tiers.Unbounded}
		vok := p.values(it, ip, func(key string, v *yaml.Node) (valid, known bool) {
			switch key {
			case "limit":
				t.Limit, valid = p.integer(v, ip.k(key), 1, "must be >= 1")
			case "window":
				t.Window, valid = p.duration(v, ip.k(key), true)
			case "active":
				t.Active, valid = p.duration(v, ip.k(key), false)
			case "cooldown":
				t.Cooldown, valid = p.duration(v, ip.k(key), false)
			case "skippable":
				t.Skippable, valid = p.boolean(v, ip.k(key))
			default:
				return false, false
			}
			return valid, true
		})
		ok = p.require(it, ip, "limit", "window") && vok && ok
		pol.Tiers = append(pol.Tiers, t)
	}
	if !ok {
		return nil, false
	}
	// Normalization, paper §4.1: tiers.Normalize names the tiers it
	// changes by their index in the config ("tiers[2]: ...").
	norm, notes := tiers.Normalize(*pol)
	for _, note := range notes {
		if m := tierNote.FindStringSubmatch(note); m != nil {
			if i, err := strconv.Atoi(m[1]); err == nil && i < len(items) {
				p.warnf(items[i], path.i(i), "%s", m[2])
				continue
			}
		}
		p.warnf(k, path, "%s", note)
	}
	pol = &norm
	if len(pol.Tiers) == 0 {
		p.warnf(k, path, "no tiers: every request is rejected")
		pol.Tiers = nil
	}
	return pol, true
}

func (p *parser) tokenBucket(n *yaml.Node, path *ypath) (*tiers.Policy, bool) {
	if !p.mapping(n, path) {
		return nil, false
	}
	pol := &tiers.Policy{Kind: tiers.KindTokenBucket}
	ok := p.values(n, path, func(key string, v *yaml.Node) (valid, known bool) {
		switch key {
		case "capacity":
			pol.Bucket.Capacity, valid = p.integer(v, path.k(key), 1, "must be >= 1")
		case "refill":
			pol.Bucket.Refill, valid = p.integer(v, path.k(key), 1, "must be >= 1")
		case "per":
			pol.Bucket.Per, valid = p.duration(v, path.k(key), true)
		default:
			return false, false
		}
		return valid, true
	})
	return pol, p.require(n, path, "capacity", "refill", "per") && ok
}

func (p *parser) copies(n *yaml.Node, path *ypath) (*descriptors.Copies, bool) {
	if !p.mapping(n, path) {
		return nil, false
	}
	c := &descriptors.Copies{}
	ok := p.values(n, path, func(key string, v *yaml.Node) (valid, known bool) {
		switch key {
		case "domain_limit":
			c.DomainLimit, valid = p.integer(v, path.k(key), 0, "must be >= 0")
		case "global_limit":
			c.GlobalLimit, valid = p.integer(v, path.k(key), 1, "must be >= 1 (leave it out for no limit)")
		case "groups":
			valid = p.groups(v, path.k(key), c)
		default:
			return false, false
		}
		return valid, true
	})
	return c, p.require(n, path, "domain_limit") && ok
}

func (p *parser) groups(n *yaml.Node, path *ypath, c *descriptors.Copies) bool {
	ok := true
	names := map[string]bool{}
	for i, it := range p.list(n, path) {
		ip := path.i(i)
		if !p.mapping(it, ip) {
			ok = false
			continue
		}
		var g descriptors.Group
		vok := p.values(it, ip, func(key string, v *yaml.Node) (valid, known bool) {
			switch key {
			case "name":
				g.Name, valid = p.str(v, ip.k(key))
			case "limit":
				g.Limit, valid = p.integer(v, ip.k(key), 0, "must be >= 0")
			case "members":
				fp := ip.k(key)
				valid = true
				for j, m := range p.list(v, fp) {
					s, sok := p.str(m, fp.i(j))
					if sok && s == "" {
						p.errf(m, fp.i(j), "empty member")
						sok = false
					}
					valid = valid && sok
					g.Members = append(g.Members, domainKey(s))
				}
			default:
				return false, false
			}
			return valid, true
		})
		ok = ok && vok
		switch {
		case g.Name == "":
			p.errf(it, ip.k("name"), "missing")
			ok = false
		case names[g.Name]:
			p.errf(it, ip.k("name"), "group %q given twice", g.Name)
			ok = false
		}
		if !p.require(it, ip, "limit") {
			ok = false
		}
		names[g.Name] = true
		c.Groups = append(c.Groups, g)
	}
	return ok
}

// lowerCopies lowers copy limits above the global limit (paper §4.1).
func (p *parser) lowerCopies(n *yaml.Node, path *ypath, c *descriptors.Copies) {
	g := c.GlobalLimit
	if c.DomainLimit > g {
		p.warnf(n, path.k("domain_limit"), "domain_limit %d above global_limit %d: lowered to %d", c.DomainLimit, g, g)
		c.DomainLimit = g
	}
	for i := range c.Groups {
		if c.Groups[i].Limit > g {
			p.warnf(n, path.k("groups").i(i).k("limit"), "group limit %d above global_limit %d: lowered to %d", c.Groups[i].Limit, g, g)
			c.Groups[i].Limit = g
		}
	}
	for d, v := range c.Overrides {
		if v > g {
			p.warnf(n, path, "override for domain %q: domain_limit %d above global_limit %d: lowered to %d", d, v, g, g)
			c.Overrides[d] = g
		}
	}
}

// overrides parses the domain-specific configurations of l. A rate override
// replaces the default policy for its domain entirely (hard_limit included),
// except the resource-wide global_limit, which it keeps.
func (p *parser) overrides(n *yaml.Node, path *ypath, l *descriptors.Limit) bool {
	ok := true
	lines := map[string]int{}
	for i, it := range p.list(n, path) {
		if !p.override(it, path.i(i), l, lines) {
			ok = false
		}
	}
	return ok
}

// override parses one override of l; lines holds the line of each domain
// already overridden.
func (p *parser) override(n *yaml.Node, path *ypath, l *descriptors.Limit, lines map[string]int) bool {
	if !p.mapping(n, path) {
		return false
	}
	var domain string
	var domainNode *yaml.Node
	ls := leafSpec{}
	var dl *yaml.Node
	p.fields(n, path, func(key string, k, v *yaml.Node) bool {
		switch key {
		case "domain":
			domainNode = v
			domain, _ = p.str(v, path.k(key))
		case "rate_limit", "tiers", "token_bucket", "concurrency", "hard_limit":
			ls.set(key, k, v)
		case "domain_limit":
			dl = v
		default:
			return false
		}
		return true
	})
	if domain == "" {
		p.errf(n, path.k("domain"), "missing: name the Charon domain this override is for")
		return false
	}
	if line, dup := lines[domain]; dup {
		p.errf(domainNode, path.k("domain"), "domain %q already overridden at line %d", domain, line)
		return false
	}
	lines[domain] = domainNode.Line
	domain = domainKey(domain)
	if l.Copies != nil {
		if len(ls) > 0 || dl == nil {
			p.errf(n, path, "an override of copies gives domain_limit only")
			return false
		}
		v, vok := p.integer(dl, path.k("domain_limit"), 0, "must be >= 0")
		if !vok {
			return false
		}
		if l.Copies.Overrides == nil {
			l.Copies.Overrides = map[string]int64{}
		}
		l.Copies.Overrides[domain] = v
		return true
	}
	if dl != nil {
		p.errf(dl, path.k("domain_limit"), "applies only to copies")
		return false
	}
	gs := ls.pick("rate_limit", "tiers", "token_bucket", "concurrency")
	if len(gs) != 1 {
		p.errf(n, path, "an override gives exactly one policy: rate_limit, tiers, token_bucket or concurrency")
		return false
	}
	g := gs[0]
	gp := path.k(g.name)
	var pol *tiers.Policy
	var pok bool
	switch g.name {
	case "rate_limit":
		pol, _, pok = p.rateLimit(g.v, gp, false)
	case "tiers":
		pol, pok = p.tierList(g.k, g.v, gp)
	case "token_bucket":
		pol, pok = p.tokenBucket(g.v, gp)
	case "concurrency":
		pol, pok = p.concurrency(g.v, gp)
	}
	if !pok {
		return false
	}
	// A refund gives back a concurrency limit's slots: a rule is one for
	// every domain or for none, so that a stream-done refund always meets
	// the kind of limit its request's grant took.
	if dc := l.Policy != nil && l.Policy.Concurrency; dc != pol.Concurrency {
		if dc {
			p.errf(g.k, gp, "an override of a concurrency limit gives concurrency: {limit, ttl}")
		} else {
			p.errf(g.k, gp, "a concurrency override needs a concurrency limit on the descriptor")
		}
		return false
	}
	if hl, set := ls["hard_limit"]; set && pol.Concurrency {
		p.errf(hl.k, path.k("hard_limit"), "does not apply to a concurrency limit (concurrency counts requests in flight)")
		return false
	}
	if hl, set := ls["hard_limit"]; set && banned(pol) {
		p.warnf(hl.k, path.k("hard_limit"), "ignored: requests_per_unit 0 rejects every request")
	} else if set {
		if pol.Kind != tiers.KindTiers {
			p.errf(hl.k, path.k("hard_limit"), "applies only to tiers and to a sliding-window rate_limit")
			return false
		}
		v, vok := p.integer(hl.v, path.k("hard_limit"), 1, "must be >= 1 (leave it out for no limit)")
		if !vok {
			return false
		}
		pol.HardLimit = v
	}
	if pol.Kind == tiers.KindTiers && l.Policy != nil {
		pol.GlobalLimit = l.Policy.GlobalLimit
	}
	if !p.validate(g.k, path, g.name, pol) {
		return false
	}
	if l.Overrides == nil {
		l.Overrides = map[string]*tiers.Policy{}
	}
	l.Overrides[domain] = pol
	return true
}

// domainKey turns a Charon domain as a config writes it (the raw request
// values joined by ",") into the form of descriptors.Match.Domain.
func domainKey(s string) string {
	parts := strings.Split(s, ",")
	for i, v := range parts {
		parts[i] = descriptors.Escape(v)
	}
	return strings.Join(parts, ",")
}

// escrowNotes warns of the policies of l that escrow was asked for (escrow:
// true, or the server's --escrow when l does not say) and that stay on the
// shared store (tiers.LeaseFor): every reason for escrow: true; under the
// server's default only a window too short for the shortest lease, since a
// kind that is never leased is documented.
func (p *parser) escrowNotes(at *yaml.Node, path *ypath, l *descriptors.Limit) {
	asked := l.Escrow == descriptors.EscrowOn
	if !asked && (l.Escrow == descriptors.EscrowOff || !p.opts.Escrow) {
		return
	}
	longest := p.opts.EscrowLease
	if longest <= 0 {
		longest = time.Second
	}
	pols := []*tiers.Policy{l.Policy}
	for _, d := range slices.Sorted(maps.Keys(l.Overrides)) {
		pols = append(pols, l.Overrides[d])
	}
	for _, pol := range pols {
		if pol == nil || banned(pol) {
			continue
		}
		_, err := tiers.LeaseFor(pol, longest)
		if err == nil {
			continue
		}
		short := pol.Kind == tiers.KindTiers && len(pol.Tiers) == 1 && tiers.CanLease(pol, time.Nanosecond) == nil
		if asked || short {
			p.warnf(at, path.k("escrow"), "stays on the shared store: %s", strings.TrimPrefix(err.Error(), "tiers: cannot lease: "))
			return
		}
	}
}
