package store

import "slices"

// Plan is the grouping of a request's items that Apply decides by, made
// once per Decide (Make) and read by every step that needs it: Apply, the
// over-limit cache, and the Redis store, which sends it to its script. The
// rule, written here and nowhere else:
//
//   - A group is the take items (not Refund) sharing a Key, led by the
//     first of them; it asks for the sum of its members' Hits and Min, and
//     is shadow or post-paid when its leader is (items of one Key carry one
//     policy; Shadow is the leader's).
//   - The groups whose leaders' policies have a global limit and share a
//     Resource share one global state (the resource's hits over all
//     domains); Apply cuts a group's grant by the earlier granted groups of
//     its global state.
//
// A refund item belongs to no group.
//
// The zero value is the plan of no items. Make reuses the plan's memory, so
// a plan kept with a call's scratch makes no allocation once it has grown
// to the call's size. A Plan is not safe for concurrent use while Make
// runs; once made, any number of goroutines may read it.
type Plan struct {
	m      []member
	groups int
	first  int
}

// member is what the plan says of one item; the group's fields are held
// at its leader.
type member struct {
	lead   int // the group's leader; -1 for a refund
	global int // at a leader: the leader of the first group of its global state; -1 none
	next   int // the next member of the group (by index), -1 none
	tail   int // at a leader: the group's last member
	hits   int64
	min    int64
	shadow bool // at a leader: the group's
	paid   bool // at a leader: the group is post-paid
}

// Make computes the plan of items, replacing p's. It reads each item's Key,
// Hits, Min, Refund, Shadow and Policy (a nil Policy counts as one without
// a global limit, not post-paid: Check rejects such an item anyway), and
// never fails.
func (p *Plan) Make(items []Item) {
	n := len(items)
	p.m = slices.Grow(p.m[:0], n)[:n]
	p.groups, p.first = 0, -1
	for i := range items {
		it := &items[i]
		m := &p.m[i]
		*m = member{lead: -1, global: -1, next: -1, tail: i}
		if it.Refund {
			continue
		}
		l := i
		for j := 0; j < i; j++ {
			if p.m[j].lead == j && items[j].Key == it.Key {
				l = j
				break
			}
		}
		m.lead = l
		ld := &p.m[l]
		ld.hits += it.Hits
		ld.min += it.Min
		if l != i {
			// Members stay in item order.
			p.m[ld.tail].next = i
			ld.tail = i
			continue
		}
		p.groups++
		if p.first < 0 {
			p.first = i
		}
		m.shadow = it.Shadow
		if it.Policy == nil {
			continue
		}
		m.paid = it.Policy.Overdraft
		if it.Policy.GlobalLimit <= 0 {
			continue
		}
		m.global = i
		for j := 0; j < i; j++ {
			if p.m[j].lead == j && p.m[j].global == j && items[j].Key.Resource == it.Key.Resource {
				m.global = j
				break
			}
		}
	}
}

// Len returns the number of items the plan was made for (0 for a nil
// plan).
func (p *Plan) Len() int {
	if p == nil {
		return 0
	}
	return len(p.m)
}

// Groups returns the number of groups.
func (p *Plan) Groups() int { return p.groups }

// First returns the leader of the first group, -1 when there is none.
func (p *Plan) First() int { return p.first }

// Leader returns the leader of item i's group, i itself when i leads it,
// -1 when item i is a refund.
func (p *Plan) Leader(i int) int { return p.m[i].lead }

// Leads reports whether item i leads its group.
func (p *Plan) Leads(i int) bool { return p.m[i].lead == i }

// Next returns the member of item i's group after i, in item order, -1
// when i is the last (or a refund). From a leader it walks the group.
func (p *Plan) Next(i int) int { return p.m[i].next }

// Sums returns the summed Hits and Min of item i's group (0, 0 for a
// refund).
func (p *Plan) Sums(i int) (hits, min int64) {
	l := p.m[i].lead
	if l < 0 {
		return 0, 0
	}
	return p.m[l].hits, p.m[l].min
}

// Shadow reports whether item i's group is shadow (its leader is).
func (p *Plan) Shadow(i int) bool {
	l := p.m[i].lead
	return l >= 0 && p.m[l].shadow
}

// PostPaid reports whether item i's group is post-paid (its policy is
// Overdraft): its hits are debited whatever the answer.
func (p *Plan) PostPaid(i int) bool {
	l := p.m[i].lead
	return l >= 0 && p.m[l].paid
}

// Global returns the leader of the first group sharing the global state of
// item i's group (that group's own leader when it is the first), -1 when
// its policy has no global limit or i is a refund. Two groups share a
// global state exactly when their Globals are equal and not -1.
func (p *Plan) Global(i int) int {
	l := p.m[i].lead
	if l < 0 {
		return -1
	}
	return p.m[l].global
}

// SharesGlobal reports whether another group of the plan shares the global
// state of item i's group.
func (p *Plan) SharesGlobal(i int) bool {
	g := p.Global(i)
	if g < 0 {
		return false
	}
	l := p.m[i].lead
	for j := range p.m {
		if j != l && p.m[j].lead == j && p.m[j].global == g {
			return true
		}
	}
	return false
}
