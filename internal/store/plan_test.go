package store_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/tiers"
)

// planView is everything a Plan says of one item.
type planView struct {
	Leader, Next   int
	Hits, Min      int64
	Shadow, Paid   bool
	Global         int
	SharesGlobal   bool
	Leads          bool
	GroupsInPlan   int
	FirstOfTheList int
}

func viewPlan(p *store.Plan) []planView {
	v := make([]planView, p.Len())
	for i := range v {
		h, m := p.Sums(i)
		v[i] = planView{
			Leader: p.Leader(i), Next: p.Next(i), Hits: h, Min: m,
			Shadow: p.Shadow(i), Paid: p.PostPaid(i), Global: p.Global(i), SharesGlobal: p.SharesGlobal(i),
			Leads: p.Leads(i), GroupsInPlan: p.Groups(), FirstOfTheList: p.First(),
		}
	}
	return v
}

// brutePlan is the grouping rule as store.Apply states it, item by item,
// with no shortcut: what a Plan must say.
func brutePlan(items []store.Item) []planView {
	v := make([]planView, len(items))
	groups, first := 0, -1
	leader := func(i int) int {
		if items[i].Refund {
			return -1
		}
		for j := 0; j <= i; j++ {
			if !items[j].Refund && items[j].Key == items[i].Key {
				return j
			}
		}
		panic("unreachable")
	}
	global := func(l int) int {
		pl := items[l].Policy
		if pl == nil || pl.GlobalLimit <= 0 {
			return -1
		}
		for j := 0; j <= l; j++ {
			pj := items[j].Policy
			if leader(j) == j && pj != nil && pj.GlobalLimit > 0 &&
				items[j].Key.Resource == items[l].Key.Resource {
				return j
			}
		}
		panic("unreachable")
	}
	for i := range items {
		l := leader(i)
		w := planView{Leader: l, Next: -1, Global: -1, Leads: l == i}
		if l >= 0 {
			if l == i {
				groups++
				if first < 0 {
					first = i
				}
			}
			for j := range items {
				if leader(j) == l {
					w.Hits += items[j].Hits
					w.Min += items[j].Min
					if j > i && w.Next < 0 {
						w.Next = j
					}
				}
			}
			w.Shadow = items[l].Shadow
			w.Paid = items[l].Policy != nil && items[l].Policy.Overdraft
			w.Global = global(l)
			for j := range items {
				if w.Global >= 0 && leader(j) == j && j != l && global(j) == w.Global {
					w.SharesGlobal = true
				}
			}
		}
		v[i] = w
	}
	for i := range v {
		v[i].GroupsInPlan, v[i].FirstOfTheList = groups, first
	}
	return v
}

var (
	plainPol  = &tiers.Policy{Tiers: []tiers.Tier{{Limit: 10, Window: 1e9, Active: tiers.Unbounded}}}
	globalPol = &tiers.Policy{GlobalLimit: 100, Tiers: []tiers.Tier{{Limit: 10, Window: 1e9, Active: tiers.Unbounded}}}
	paidPol   = &tiers.Policy{Overdraft: true, Tiers: []tiers.Tier{{Limit: 10, Window: 1e9, Active: tiers.Unbounded}}}
)

func TestPlan(t *testing.T) {
	key := func(r, d string, id uint64) store.Key { return store.Key{Resource: r, Domain: d, PolicyID: id} }
	take := func(k store.Key, p *tiers.Policy, hits, min int64) store.Item {
		return store.Item{Key: k, Policy: p, Hits: hits, Min: min}
	}
	refund := func(k store.Key, p *tiers.Policy, hits int64) store.Item {
		return store.Item{Key: k, Policy: p, Hits: hits, Refund: true}
	}
	shadow := func(it store.Item) store.Item { it.Shadow = true; return it }
	a, b, c := key("r", "a", 1), key("r", "b", 1), key("s", "a", 1)
	for _, tc := range []struct {
		name  string
		items []store.Item
		want  []planView
	}{
		{name: "none", items: nil, want: []planView{}},
		{
			name:  "distinct keys: a group each",
			items: []store.Item{take(a, plainPol, 2, 1), take(b, plainPol, 1, 1), take(c, plainPol, 3, 3)},
			want: []planView{
				{Leader: 0, Next: -1, Hits: 2, Min: 1, Global: -1, Leads: true, GroupsInPlan: 3},
				{Leader: 1, Next: -1, Hits: 1, Min: 1, Global: -1, Leads: true, GroupsInPlan: 3},
				{Leader: 2, Next: -1, Hits: 3, Min: 3, Global: -1, Leads: true, GroupsInPlan: 3},
			},
		},
		{
			name:  "one key: one group led by the first take, a refund of it apart",
			items: []store.Item{refund(a, plainPol, 5), take(a, plainPol, 2, 1), take(b, plainPol, 1, 1), take(a, plainPol, 0, 0), take(a, plainPol, 4, 2)},
			want: []planView{
				{Leader: -1, Next: -1, Global: -1, GroupsInPlan: 2, FirstOfTheList: 1},
				{Leader: 1, Next: 3, Hits: 6, Min: 3, Global: -1, Leads: true, GroupsInPlan: 2, FirstOfTheList: 1},
				{Leader: 2, Next: -1, Hits: 1, Min: 1, Global: -1, Leads: true, GroupsInPlan: 2, FirstOfTheList: 1},
				{Leader: 1, Next: 4, Hits: 6, Min: 3, Global: -1, GroupsInPlan: 2, FirstOfTheList: 1},
				{Leader: 1, Next: -1, Hits: 6, Min: 3, Global: -1, GroupsInPlan: 2, FirstOfTheList: 1},
			},
		},
		{
			name:  "a group is shadow and post-paid as its leader",
			items: []store.Item{shadow(take(a, paidPol, 1, 1)), take(a, paidPol, 1, 1), take(b, plainPol, 1, 1), shadow(take(b, plainPol, 1, 1))},
			want: []planView{
				{Leader: 0, Next: 1, Hits: 2, Min: 2, Shadow: true, Paid: true, Global: -1, Leads: true, GroupsInPlan: 2},
				{Leader: 0, Next: -1, Hits: 2, Min: 2, Shadow: true, Paid: true, Global: -1, GroupsInPlan: 2},
				{Leader: 2, Next: 3, Hits: 2, Min: 2, Global: -1, Leads: true, GroupsInPlan: 2},
				{Leader: 2, Next: -1, Hits: 2, Min: 2, Global: -1, GroupsInPlan: 2},
			},
		},
		{
			name: "a global state shared by the domains of a resource, whatever their shapes",
			items: []store.Item{
				take(a, globalPol, 1, 1), take(key("r", "a", 2), globalPol, 1, 1), take(b, globalPol, 1, 1),
				take(key("r", "c", 1), plainPol, 1, 1), take(a, globalPol, 1, 1), take(key("s", "a", 2), globalPol, 1, 1),
			},
			want: []planView{
				{Leader: 0, Next: 4, Hits: 2, Min: 2, Global: 0, SharesGlobal: true, Leads: true, GroupsInPlan: 5},
				{Leader: 1, Next: -1, Hits: 1, Min: 1, Global: 0, SharesGlobal: true, Leads: true, GroupsInPlan: 5},
				{Leader: 2, Next: -1, Hits: 1, Min: 1, Global: 0, SharesGlobal: true, Leads: true, GroupsInPlan: 5},
				{Leader: 3, Next: -1, Hits: 1, Min: 1, Global: -1, Leads: true, GroupsInPlan: 5},
				{Leader: 0, Next: -1, Hits: 2, Min: 2, Global: 0, SharesGlobal: true, GroupsInPlan: 5},
				{Leader: 5, Next: -1, Hits: 1, Min: 1, Global: 5, Leads: true, GroupsInPlan: 5},
			},
		},
		{
			name:  "refunds only, and an item with no policy",
			items: []store.Item{refund(a, globalPol, 1), refund(b, globalPol, 1), {Key: c, Hits: 1, Min: 1}},
			want: []planView{
				{Leader: -1, Next: -1, Global: -1, GroupsInPlan: 1, FirstOfTheList: 2},
				{Leader: -1, Next: -1, Global: -1, GroupsInPlan: 1, FirstOfTheList: 2},
				{Leader: 2, Next: -1, Hits: 1, Min: 1, Global: -1, Leads: true, GroupsInPlan: 1, FirstOfTheList: 2},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p store.Plan
			// A plan made before, bigger, leaves nothing behind.
			p.Make([]store.Item{take(a, globalPol, 9, 9), take(a, globalPol, 9, 9), take(b, globalPol, 9, 9), take(a, paidPol, 1, 1), take(c, paidPol, 1, 1), take(c, paidPol, 1, 1), take(c, paidPol, 1, 1)})
			p.Make(tc.items)
			if diff := cmp.Diff(tc.want, viewPlan(&p)); diff != "" {
				t.Errorf("plan (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.want, brutePlan(tc.items)); diff != "" {
				t.Errorf("the brute-force plan disagrees with the table (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPlanAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under -race")
	}
	items := planItems([]byte("a fair sized request of several items, some sharing keys and globals"))
	var p store.Plan
	p.Make(items)
	if n := testing.AllocsPerRun(100, func() { p.Make(items) }); n != 0 {
		t.Errorf("Make of a plan of that size again: %v allocations, want 0", n)
	}
}

// planItems decodes data into items, three bytes an item: few resources,
// domains and policy IDs (so that keys and global states repeat), refund
// and shadow flags, hits and minimum; the items of one Key carry one
// policy (drawn at its first item), as Decide requires.
func planItems(data []byte) []store.Item {
	pols := []*tiers.Policy{plainPol, globalPol, paidPol, {GlobalLimit: 5, Overdraft: true}, nil}
	byKey := map[store.Key]*tiers.Policy{}
	var items []store.Item
	for len(data) >= 3 && len(items) < 40 {
		b0, b1, b2 := data[0], data[1], data[2]
		data = data[3:]
		k := store.Key{Resource: string('r' + rune(b0%3)), Domain: string('a' + rune(b0/3%3)), PolicyID: uint64(b0 / 9 % 2)}
		p, ok := byKey[k]
		if !ok {
			p = pols[int(b1)%len(pols)]
			byKey[k] = p
		}
		hits := int64(b2 % 7)
		items = append(items, store.Item{Key: k, Policy: p, Hits: hits, Min: int64(b2/7) % (hits + 1), Refund: b1&0x40 != 0, Shadow: b1&0x80 != 0})
	}
	return items
}

// FuzzPlan holds Plan to the rule item by item (brutePlan) on any items,
// reusing one plan across calls as a store's scratch does.
func FuzzPlan(f *testing.F) {
	f.Add([]byte("abcabcabc"))
	f.Add([]byte{0, 1, 9, 3, 1, 9, 0, 0x41, 3, 1, 0x81, 4, 0, 2, 20})
	f.Add([]byte("a fair sized request of several items, some sharing keys and globals"))
	var p store.Plan
	f.Fuzz(func(t *testing.T, data []byte) {
		items := planItems(data)
		p.Make(items)
		want := brutePlan(items)
		if len(want) == 0 {
			want = []planView{}
		}
		if diff := cmp.Diff(want, viewPlan(&p)); diff != "" {
			t.Errorf("items %+v: plan (-brute force +got):\n%s", items, diff)
		}
	})
}
