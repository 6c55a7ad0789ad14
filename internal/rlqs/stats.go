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
		b.mu.Lock()
		for bk := range b.members {
			r.Instances++
			r.Demand += bk.rateNow()
			r.Assigned += float64(bk.share.Load()) / sec
			if shares {
				r.Shares = append(r.Shares, InstanceShare{Stream: bk.s.id, Bucket: bk.key, Domain: bk.domain,
					Demand: bk.rateNow(), Share: float64(bk.share.Load()) / sec})
			}
		}
		b.mu.Unlock()
	}
	for rule, n := range a.reports {
		get(rule).Reports = n.Load()
	}
	st := Stats{Streams: len(a.streams), StoreErrors: a.errs.Load()}
	for _, r := range byRule {
		slices.SortFunc(r.Shares, func(x, y InstanceShare) int { return cmp.Compare(x.Stream+x.Bucket, y.Stream+y.Bucket) })
		st.Rules = append(st.Rules, *r)
	}
	slices.SortFunc(st.Rules, func(x, y RuleStats) int { return cmp.Compare(x.Rule, y.Rule) })
	return st
}

// Explanation is how a bucket id resolves, and the shares of its budget.
type Explanation struct {
	Domain string
	Bucket map[string]string
	// Rule is the matched rule (its resource), empty when no rule limits
	// the bucket: then Fallback is the answer.
	// The budget's limit is Limit tokens per Fill (the unit of the
	// shares: a limit per second is split in tokens per 10 s), PerSecond
	// per second.
	Rule      string `json:",omitempty"`
	Budget    string `json:",omitempty"`
	Limit     int64
	Fill      string  `json:",omitempty"`
	PerSecond float64 `json:",omitempty"`
	Fallback  string  `json:",omitempty"`
	// Shares are this process' streams reporting the budget.
	Shares []InstanceShare
}

// Explain resolves a bucket id of domain as a report would, and lists the
// shares of its budget on this process.
func (a *Allocator) Explain(domain string, id map[string]string) Explanation {
	x := Explanation{Domain: domain, Bucket: id, Shares: []InstanceShare{}}
	b, rule, fill, _, ok := budgetOf(a.o.Tree(), domain, id)
	if !ok {
		x.Fallback = "ALLOW_ALL"
		if a.o.Unmatched == DenyAll && rule != "unlimited" {
			x.Fallback = "DENY_ALL"
		}
		return x
	}
	x.Rule, x.Budget, x.Limit, x.Fill, x.PerSecond = rule, b.Key, b.Limit, fill.String(), float64(b.Limit)/fill.Seconds()
	a.mu.Lock()
	defer a.mu.Unlock()
	if bg := a.budgets[b.Key]; bg != nil {
		sec := fill.Seconds()
		bg.mu.Lock()
		for bk := range bg.members {
			x.Shares = append(x.Shares, InstanceShare{Stream: bk.s.id, Bucket: bk.key, Domain: bk.domain, Demand: bk.rateNow(), Share: float64(bk.share.Load()) / sec})
		}
		bg.mu.Unlock()
	}
	slices.SortFunc(x.Shares, func(p, q InstanceShare) int { return cmp.Compare(p.Stream+p.Bucket, q.Stream+q.Bucket) })
	return x
}
