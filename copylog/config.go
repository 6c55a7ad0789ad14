package copylog

import (
	"fmt"
	"time"
)

// Bounds that keep every quantity of the package an integer below 2^53, so
// that a Lua 5.1 implementation (whose numbers are doubles) computes exactly
// what this package computes.
const (
	// MaxCopies is the largest limit a Config may name and the most copies
	// one operation may ask for.
	MaxCopies int64 = 1 << 50
	// MaxLease is the longest lease or transfer ttl (about 35 years).
	MaxLease time.Duration = (1 << 50) * time.Microsecond
	// MaxIDLen is the longest hold id, transfer id, request id, session or
	// domain, in bytes.
	MaxIDLen = 1024
)

// Group is a domain group: its members together hold at most Limit copies.
// A domain in several groups takes one copy from each group's pool.
type Group struct {
	// Name identifies the group's pool: holds record the names of the groups
	// their domain belonged to when they were reserved, and give the copies
	// back to the pools of those names.
	Name    string
	Limit   int64
	Members []string
}

// Config is the limit of a copy-limited resource (SPEC §4, paper §2.2). The
// zero value lets no domain hold anything (DomainLimit 0). A Config is only
// read by the package; it may be shared by concurrent operations on
// different States as long as nobody modifies it.
type Config struct {
	// DomainLimit is the most copies one domain may hold, unless Overrides
	// names the domain.
	DomainLimit int64
	// GlobalLimit is the most copies all domains together may hold; 0: no
	// global limit.
	GlobalLimit int64
	// Groups are the domain groups, each with its own pool.
	Groups []Group
	// Overrides are domain-specific domain limits (paper §2.2: "a
	// domain-specific configuration may redefine the domain limit"); nil
	// when there are none.
	Overrides map[string]int64
}

// Validate reports whether Reserve accepts c: every limit in [0, MaxCopies]
// and group names non-empty and distinct. The error wraps ErrBadConfig.
func (c *Config) Validate() error {
	if c == nil {
		return fmt.Errorf("%w: nil", ErrBadConfig)
	}
	if c.DomainLimit < 0 || c.DomainLimit > MaxCopies {
		return fmt.Errorf("%w: domain limit %d", ErrBadConfig, c.DomainLimit)
	}
	if c.GlobalLimit < 0 || c.GlobalLimit > MaxCopies {
		return fmt.Errorf("%w: global limit %d", ErrBadConfig, c.GlobalLimit)
	}
	for d, v := range c.Overrides {
		if v < 0 || v > MaxCopies {
			return fmt.Errorf("%w: domain limit %d for domain %q", ErrBadConfig, v, d)
		}
	}
	for i := range c.Groups {
		g := &c.Groups[i]
		if g.Name == "" {
			return fmt.Errorf("%w: groups[%d]: empty name", ErrBadConfig, i)
		}
		if g.Limit < 0 || g.Limit > MaxCopies {
			return fmt.Errorf("%w: group %q: limit %d", ErrBadConfig, g.Name, g.Limit)
		}
		for j := 0; j < i; j++ {
			if c.Groups[j].Name == g.Name {
				return fmt.Errorf("%w: group %q given twice", ErrBadConfig, g.Name)
			}
		}
	}
	return nil
}

// domainLimit is the domain limit of domain d.
func (c *Config) domainLimit(d string) int64 {
	if v, ok := c.Overrides[d]; ok {
		return v
	}
	return c.DomainLimit
}

// member reports whether d is a member of g.
func (g *Group) member(d string) bool {
	for _, m := range g.Members {
		if m == d {
			return true
		}
	}
	return false
}
