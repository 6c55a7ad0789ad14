package rlqs

import (
	"cmp"
	"slices"
)

// RuleStats describes one rule's budgets on this process. Rates are per
// second: Limit the budgets' limits (each Charon domain of a rule is a
// budget of its own), Demand the instances' smoothed request rates,
// Assigned the shares they hold.
type RuleStats struct {
	Rule                    string
	Budgets, Instances      int
	Limit, Demand, Assigned float64
	Reports                 uint64
	// Shares are the instances' shares (tokens per second), for explain.
	Shares []InstanceShare `json:",omitempty"`
}

// InstanceShare is one instance's demand and share, per second.
type InstanceShare struct {
	Stream, Bucket, Domain string
	Demand, Share          float64
}

// Stats is a snapshot of the pipeline.
type Stats struct {
	Streams int
	Rules   []RuleStats
	// StoreErrors counts allocations the store failed.
	StoreErrors uint64
}

// Stats returns a snapshot; with shares, every instance's share too.
func (a *Allocator) Stats(shares bool) Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	byRule := map[string]*RuleStats{}
	get := func(rule string) *RuleStats {
		r := byRule[rule]
		if r == nil {
			r = &RuleStats{Rule: rule}
			byRule[rule] = r
		}
		return r
	}
	for _, b := range a.budgets {
		r := get(b.rule)
		r.Budgets++
		sec := b.fill.Seconds()
		r.Limit += float64(b.b.Limit) / sec
		for bk := range b.members {
			r.Instances++
			r.Demand += bk.rate
			r.Assigned += float64(bk.share) / sec
			if shares {
				r.Shares = append(r.Shares, InstanceShare{Stream: bk.s.id, Bucket: bk.key, Domain: bk.domain,
					Demand: bk.rate, Share: float64(bk.share) / sec})
			}
		}
	}
	for rule, n := range a.reports {
		get(rule).Reports = n
	}
	st := Stats{Streams: len(a.streams), StoreErrors: a.errs}
	for _, r := range byRule {
		slices.SortFunc(r.Shares, func(x, y InstanceShare) int { return cmp.Compare(x.Stream+x.Bucket, y.Stream+y.Bucket) })
		st.Rules = append(st.Rules, *r)
	}
	slices.SortFunc(st.Rules, func(x, y RuleStats) int { return cmp.Compare(x.Rule, y.Rule) })
	return st
}
