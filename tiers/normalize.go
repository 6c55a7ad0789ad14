package tiers

import "fmt"

// Normalize returns p normalized as the paper §4.1 and SPEC §2 describe, with
// one human-readable note per change, naming the tier by its index in p:
//   - a tier whose active period is 0 is removed;
//   - a window longer than a finite active period is cut to the active period;
//   - a finite active period that is not a whole multiple of its window is cut
//     down to one (so no partial window ends an active period).
//
// p is not modified (its Tiers are copied when anything changes). Policies of
// other kinds are returned unchanged. Normalize assumes non-negative
// durations (see Validate).
func Normalize(p Policy) (Policy, []string) {
	if p.Kind != KindTiers {
		return p, nil
	}
	var notes []string
	out := make([]Tier, 0, len(p.Tiers))
	for i, t := range p.Tiers {
		if t.Active == 0 {
			notes = append(notes, fmt.Sprintf("tiers[%d]: removed (active 0)", i))
			continue
		}
		if t.Active != Unbounded && t.Window > t.Active {
			notes = append(notes, fmt.Sprintf("tiers[%d]: window %v cut to active %v", i, t.Window, t.Active))
			t.Window = t.Active
		}
		if t.Active != Unbounded && t.Window > 0 && t.Active%t.Window != 0 {
			a := t.Active - t.Active%t.Window
			notes = append(notes, fmt.Sprintf("tiers[%d]: active %v cut to %v (whole windows of %v)", i, t.Active, a, t.Window))
			t.Active = a
		}
		out = append(out, t)
	}
	if notes == nil {
		return p, nil
	}
	p.Tiers = out
	return p, notes
}
