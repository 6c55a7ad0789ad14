package config

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/charonlimit/charon/tiers"
)

type dumpDoc struct {
	Domains []dumpDomain `yaml:"domains"`
}

type dumpDomain struct {
	Domain            string         `yaml:"domain"`
	IgnoreLimits      bool           `yaml:"ignore_limits,omitempty"`
	AllowUnconfigured bool           `yaml:"allow_unconfigured,omitempty"`
	CalendarUnits     string         `yaml:"calendar_units,omitempty"`
	Resources         []dumpResource `yaml:"resources"`
}

type dumpResource struct {
	Resource       string         `yaml:"resource"`
	Source         string         `yaml:"source"`
	ID             string         `yaml:"id"`
	Name           string         `yaml:"name,omitempty"`
	Replaces       []string       `yaml:"replaces,omitempty,flow"`
	Unlimited      bool           `yaml:"unlimited,omitempty"`
	ShadowMode     bool           `yaml:"shadow_mode,omitempty"`
	QuotaMode      bool           `yaml:"quota_mode,omitempty"`
	DetailedMetric bool           `yaml:"detailed_metric,omitempty"`
	Policy         *dumpPolicy    `yaml:"policy,omitempty"`
	Overrides      []dumpOverride `yaml:"overrides,omitempty"`
	Copies         *dumpCopies    `yaml:"copies,omitempty"`
	Quota          *dumpPolicy    `yaml:"calendar_quota,omitempty"`
}

type dumpPolicy struct {
	Algorithm   string      `yaml:"algorithm"`
	Closed      bool        `yaml:"closed,omitempty"`
	HardLimit   int64       `yaml:"hard_limit,omitempty"`
	GlobalLimit int64       `yaml:"global_limit,omitempty"`
	Tiers       []dumpTier  `yaml:"tiers,omitempty"`
	TokenBucket *dumpBucket `yaml:"token_bucket,omitempty"`
	FixedWindow *dumpFixed  `yaml:"fixed_window,omitempty"`
	Quota       *dumpQuota  `yaml:"quota,omitempty"`
	Concurrency *dumpConc   `yaml:"concurrency,omitempty"`
	Overdraft   bool        `yaml:"overdraft,omitempty"`
}

type dumpConc struct {
	Limit int64  `yaml:"limit"`
	TTL   string `yaml:"ttl"`
}

type dumpQuota struct {
	Limit    int64  `yaml:"limit"`
	Period   string `yaml:"period"`
	TimeZone string `yaml:"time_zone,omitempty"`
	Anchor   string `yaml:"anchor,omitempty"`
}

type dumpTier struct {
	Limit     int64  `yaml:"limit"`
	Window    string `yaml:"window"`
	Active    string `yaml:"active"`
	Cooldown  string `yaml:"cooldown"`
	Skippable bool   `yaml:"skippable"`
}

type dumpBucket struct {
	Capacity int64  `yaml:"capacity"`
	Refill   int64  `yaml:"refill"`
	Per      string `yaml:"per"`
}

type dumpFixed struct {
	Limit int64  `yaml:"limit"`
	Unit  string `yaml:"unit"`
}

type dumpOverride struct {
	Domain      string      `yaml:"domain"`
	Policy      *dumpPolicy `yaml:"policy,omitempty"`
	DomainLimit *int64      `yaml:"domain_limit,omitempty"`
}

type dumpCopies struct {
	DomainLimit int64       `yaml:"domain_limit"`
	GlobalLimit int64       `yaml:"global_limit,omitempty"`
	Groups      []dumpGroup `yaml:"groups,omitempty"`
}

type dumpGroup struct {
	Name    string   `yaml:"name"`
	Limit   int64    `yaml:"limit"`
	Members []string `yaml:"members,flow"`
}

func dumpPol(p *tiers.Policy) *dumpPolicy {
	if p == nil {
		return nil
	}
	d := &dumpPolicy{Algorithm: p.Kind.String(), Overdraft: p.Overdraft}
	if p.Concurrency && len(p.Tiers) == 1 {
		d.Algorithm = "concurrency"
		d.Concurrency = &dumpConc{p.Tiers[0].Limit, fmtDur(p.Tiers[0].Window)}
		return d
	}
	switch p.Kind {
	case tiers.KindTiers:
		d.Closed = len(p.Tiers) == 0
		d.HardLimit, d.GlobalLimit = p.HardLimit, p.GlobalLimit
		for _, t := range p.Tiers {
			d.Tiers = append(d.Tiers, dumpTier{t.Limit, fmtDur(t.Window), fmtDur(t.Active), fmtDur(t.Cooldown), t.Skippable})
		}
	case tiers.KindTokenBucket:
		d.TokenBucket = &dumpBucket{p.Bucket.Capacity, p.Bucket.Refill, fmtDur(p.Bucket.Per)}
	case tiers.KindFixedWindow:
		d.FixedWindow = &dumpFixed{p.Window.Limit, p.Window.Unit.String()}
	case tiers.KindQuota:
		q := &p.Quota
		d.Quota = &dumpQuota{Limit: q.Limit, Period: q.Period.String()}
		if q.Location != nil {
			d.Quota.TimeZone = q.Location.String()
		}
		if !q.Anchor.IsZero() {
			d.Quota.Anchor = q.Anchor.Format(time.RFC3339Nano)
		}
	}
	return d
}

// Dump renders the resolved tree as YAML: per RLS domain (sorted by name),
// its resources sorted by resource identity, each with its source, policy
// ID and effective, normalized policies. Overrides are sorted by domain.
// The output is stable: the same files give the same bytes.
func (c *Config) Dump() ([]byte, error) {
	var doc dumpDoc
	doc.Domains = []dumpDomain{}
	for _, dc := range c.Tree.Domains() {
		dd := dumpDomain{Domain: dc.Name, IgnoreLimits: dc.IgnoreLimits, AllowUnconfigured: dc.AllowUnconfigured, Resources: []dumpResource{}}
		if dc.CalendarUnits != nil {
			dd.CalendarUnits = dc.CalendarUnits.String()
		}
		for _, lf := range c.Tree.Leaves(dc.Name) {
			l := lf.Limit
			r := dumpResource{
				Resource: lf.Resource, Source: l.Where(), ID: fmt.Sprintf("%016x", l.ID),
				Name: l.Name, Replaces: l.Replaces, Unlimited: l.Unlimited, ShadowMode: l.ShadowMode, QuotaMode: l.QuotaMode,
				DetailedMetric: l.DetailedMetric, Policy: dumpPol(l.Policy), Quota: dumpPol(l.Quota),
			}
			for _, d := range sortedKeys(l.Overrides) {
				r.Overrides = append(r.Overrides, dumpOverride{Domain: d, Policy: dumpPol(l.Overrides[d])})
			}
			if cp := l.Copies; cp != nil {
				r.Copies = &dumpCopies{DomainLimit: cp.DomainLimit, GlobalLimit: cp.GlobalLimit}
				for _, g := range cp.Groups {
					r.Copies.Groups = append(r.Copies.Groups, dumpGroup{g.Name, g.Limit, g.Members})
				}
				for _, d := range sortedKeys(cp.Overrides) {
					v := cp.Overrides[d]
					r.Overrides = append(r.Overrides, dumpOverride{Domain: d, DomainLimit: &v})
				}
			}
			dd.Resources = append(dd.Resources, r)
		}
		doc.Domains = append(doc.Domains, dd)
	}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// fmtDur writes a duration the way a config would: "unbounded", "1m", "1h30m".
func fmtDur(d time.Duration) string {
	if d == tiers.Unbounded {
		return "unbounded"
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}
