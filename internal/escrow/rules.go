package escrow

import (
	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/tiers"
)

// ruleSet is which policies of the configuration in force may be leased:
// those of descriptors whose escrow: setting (or, when they do not say,
// the server's default) is on and that tiers.LeaseFor leases. A policy
// not in it (a request's own limit, a calendar quota) stays on Remote.
// A nil ruleSet, before any configuration is set, allows every policy
// LeaseFor leases when the default is on.
type ruleSet struct {
	on    map[*tiers.Policy]bool
	count int // policies leasable
	kept  int // policies asked for (escrow: true) that stay on Remote
}

// on reports whether p may be leased.
func (r *ruleSet) allows(p *tiers.Policy, s *Store) bool {
	if r == nil {
		if !s.def {
			return false
		}
		_, err := tiers.LeaseFor(p, s.lease)
		return err == nil
	}
	return r.on[p]
}

// SetTree puts the leasable policies of t in force; leases of other
// policies are retired by the next Tick. The engine calls it with every
// configuration it puts in force (engine.Options.OnSetTree), after
// Wiring.SetTree.
func (s *Store) SetTree(t *descriptors.Tree) {
	if s.next != nil {
		s.next(t)
	}
	r := &ruleSet{on: map[*tiers.Policy]bool{}}
	for _, d := range t.Domains() {
		for _, leaf := range t.Leaves(d.Name) {
			l := leaf.Limit
			if l == nil || l.Unlimited || l.Escrow == descriptors.EscrowOff || (l.Escrow == descriptors.EscrowDefault && !s.def) {
				continue
			}
			pols := []*tiers.Policy{l.Policy}
			for _, o := range l.Overrides {
				pols = append(pols, o)
			}
			for _, p := range pols {
				if p == nil {
					continue
				}
				if _, err := tiers.LeaseFor(p, s.lease); err == nil {
					r.on[p] = true
					r.count++
				} else if l.Escrow == descriptors.EscrowOn {
					r.kept++
				}
			}
		}
	}
	s.rules.Store(r)
	s.log.Info("escrow", "leasable_policies", r.count, "asked_but_shared", r.kept, "longest_lease", s.lease, "default", s.def)
}
