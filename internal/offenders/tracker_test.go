package offenders

import (
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/charonlimit/charon/descriptors"
)

var t0 = time.Date(2030, 1, 2, 3, 4, 0, 0, time.UTC) // on an epoch and a step boundary

func values(w Window) map[string]uint64 {
	out := map[string]uint64{}
	for _, it := range w.Items {
		out[it.Value] = it.Count
	}
	return out
}

// TestTrackerEpochs steps through fixed instants: hits stay for the current
// and the previous epoch, then leave.
func TestTrackerEpochs(t *testing.T) {
	tr := NewTracker(Options{K: 4, Epoch: time.Minute})
	l := &descriptors.Limit{File: "api.yaml", Line: 6, Name: "per-user"}
	es := []descriptors.Entry{{Key: "user", Value: "alice"}}
	steps := []struct {
		at           time.Duration
		value        string
		hits         uint64
		o            Outcome
		wantRejected map[string]uint64
		wantGranted  map[string]uint64
	}{
		{0, "alice", 3, Rejected, map[string]uint64{"alice": 3}, map[string]uint64{}},
		{10 * time.Second, "bob", 2, Granted, map[string]uint64{"alice": 3}, map[string]uint64{"bob": 2}},
		{70 * time.Second, "alice", 1, Shadow, map[string]uint64{"alice": 4}, map[string]uint64{"bob": 2}},
		// The first epoch has left: only the second one's hit remains.
		{130 * time.Second, "carol", 1, Granted, map[string]uint64{"alice": 1}, map[string]uint64{"carol": 1}},
		// After a long silence, nothing is left.
		{10 * time.Minute, "dave", 5, Rejected, map[string]uint64{"dave": 5}, map[string]uint64{}},
	}
	for _, st := range steps {
		now := t0.Add(st.at)
		tr.Observe(now, "api", l, "api/user", st.value, es, st.hits, st.o)
		vs := tr.Views(now, "api", "", 0)
		if len(vs) != 1 {
			t.Fatalf("at %v: %d views, want 1", st.at, len(vs))
		}
		v := vs[0]
		if diff := cmp.Diff(st.wantRejected, values(v.Rejected)); diff != "" {
			t.Errorf("at %v: rejected (-want +got):\n%s", st.at, diff)
		}
		if diff := cmp.Diff(st.wantGranted, values(v.Granted)); diff != "" {
			t.Errorf("at %v: granted (-want +got):\n%s", st.at, diff)
		}
		if want := (Rule{Domain: "api", Rule: "api.yaml:6", Name: "per-user", Resource: "api/user"}); v.Rule != want {
			t.Errorf("rule %+v, want %+v", v.Rule, want)
		}
		if want := now.Truncate(time.Minute).Add(-time.Minute); !v.Since.Equal(want) {
			t.Errorf("at %v: since %v, want %v", st.at, v.Since, want)
		}
	}
}

func TestTrackerRates(t *testing.T) {
	tr := NewTracker(Options{})
	l := &descriptors.Limit{File: "f", Line: 1}
	tr.Observe(t0, "d", l, "d/k", "a", nil, 2, Granted)
	tr.Observe(t0.Add(time.Second), "d", l, "d/k", "a", nil, 1, Rejected)
	tr.Observe(t0.Add(Step), "d", l, "d/k", "a", nil, 4, Shadow)
	tr.Observe(t0.Add(Step), "d", l, "d/k", "b", nil, 1, Granted)
	r := tr.Views(t0.Add(Step+time.Second), "d", "f:1", 0)[0].Rates
	n := len(r.Granted)
	if n != Steps || r.Step != Step || !r.End.Equal(t0.Add(2*Step)) {
		t.Fatalf("rates of %d steps of %v ending %v, want %d of %v ending %v", n, r.Step, r.End, Steps, Step, t0.Add(2*Step))
	}
	got := [][3]uint64{{r.Granted[n-2], r.Rejected[n-2], r.Shadow[n-2]}, {r.Granted[n-1], r.Rejected[n-1], r.Shadow[n-1]}}
	if diff := cmp.Diff([][3]uint64{{2, 1, 0}, {1, 0, 4}}, got); diff != "" {
		t.Errorf("last two steps (granted, rejected, shadow) (-want +got):\n%s", diff)
	}
	// Five minutes later the ring has turned over.
	r = tr.Views(t0.Add(Steps*Step+Step), "d", "", 0)[0].Rates
	for i := range Steps {
		if r.Granted[i]+r.Rejected[i]+r.Shadow[i] != 0 {
			t.Fatalf("step %d still counts hits after the ring turned", i)
		}
	}
}

// TestTrackerMaxRules: a full tracker drops a new rule's hits until an old
// rule has been silent for two epochs.
func TestTrackerMaxRules(t *testing.T) {
	tr := NewTracker(Options{MaxRules: 2, Epoch: time.Minute})
	rule := func(i int) *descriptors.Limit { return &descriptors.Limit{File: "f", Line: i} }
	tr.Observe(t0, "d", rule(1), "d/a", "x", nil, 1, Rejected)
	tr.Observe(t0.Add(90*time.Second), "d", rule(2), "d/b", "x", nil, 1, Rejected)
	tr.Observe(t0.Add(100*time.Second), "d", rule(3), "d/c", "x", nil, 1, Rejected)
	if tr.Dropped() != 1 {
		t.Errorf("dropped %d, want 1", tr.Dropped())
	}
	tr.Observe(t0.Add(2*time.Minute), "d", rule(3), "d/c", "x", nil, 1, Rejected)
	var got []string
	for _, v := range tr.Views(t0.Add(2*time.Minute), "", "", 0) {
		got = append(got, v.Rule.Rule)
	}
	if diff := cmp.Diff([]string{"f:2", "f:3"}, got); diff != "" {
		t.Errorf("rules (-want +got):\n%s", diff)
	}
	if want := 2 * 4 * Bytes(DefaultK); tr.Options().Bytes() != want {
		t.Errorf("Bytes %d, want %d", tr.Options().Bytes(), want)
	}
}

// TestTrackerHeavyTenants: three heavy tenants among thousands of light ones
// are the top three, in order.
func TestTrackerHeavyTenants(t *testing.T) {
	tr := NewTracker(Options{})
	l := &descriptors.Limit{File: "t.yaml", Line: 3}
	now := t0
	for i := range 30000 {
		now = t0.Add(time.Duration(i) * time.Millisecond)
		tr.Observe(now, "d", l, "d/tenant", "light"+strconv.Itoa(i%3000), nil, 1, Rejected)
		if i%20 == 0 {
			for h, w := range []uint64{3, 2, 1} {
				tr.Observe(now, "d", l, "d/tenant", "heavy"+strconv.Itoa(h), nil, w, Rejected)
			}
		}
	}
	items := tr.Views(now, "d", "", 3)[0].Rejected.Items
	var got []string
	for _, it := range items {
		got = append(got, it.Value)
	}
	if diff := cmp.Diff([]string{"heavy0", "heavy1", "heavy2"}, got); diff != "" {
		t.Errorf("top three (-want +got):\n%s", diff)
	}
}

func BenchmarkTrackerObserve(b *testing.B) {
	tr := NewTracker(Options{})
	l := &descriptors.Limit{File: "api.yaml", Line: 6}
	vals := make([]string, 1024)
	for i := range vals {
		vals[i] = "tenant-" + strconv.Itoa(i)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		tr.Observe(t0.Add(time.Duration(i)*time.Microsecond), "api", l, "api/user", vals[i%len(vals)], nil, 1, Rejected)
		i++
	}
}

func TestWhere(t *testing.T) {
	for _, tc := range []struct {
		l    descriptors.Limit
		want string
	}{
		{descriptors.Limit{File: "api.yaml", Line: 6}, "api.yaml:6"},
		{descriptors.Limit{File: "xds:ratelimit-config/api"}, "xds:ratelimit-config/api"},
		{descriptors.Limit{}, ""},
	} {
		if got := Where(&tc.l); got != tc.want {
			t.Errorf("Where(%q, %d) = %q, want %q", tc.l.File, tc.l.Line, got, tc.want)
		}
	}
}

// TestTrackerMillionValues: a million distinct values over ten rules, for
// 105 s (an epoch rotation), allocate nothing once the rules are tracked,
// and every sketch keeps its K slots.
func TestTrackerMillionValues(t *testing.T) {
	tr := NewTracker(Options{K: 16})
	rules := make([]*descriptors.Limit, 10)
	for i := range rules {
		rules[i] = &descriptors.Limit{File: "f", Line: i + 1}
		tr.Observe(t0, "d", rules[i], "d/k", "first", nil, 1, Rejected)
	}
	vals := make([]string, 1<<20)
	for i := range vals {
		vals[i] = "v" + strconv.Itoa(i)
	}
	i := 0
	allocs := testing.AllocsPerRun(len(vals)-1, func() {
		tr.Observe(t0.Add(time.Duration(i)*100*time.Microsecond), "d", rules[i%10], "d/k", vals[i], nil, 1, Outcome(i%3))
		i++
	})
	if allocs != 0 {
		t.Errorf("%v allocations per Observe, want 0", allocs)
	}
	for _, r := range tr.rules {
		for _, s := range append(r.cur[:], r.prev[:]...) {
			if cap(s.slots) != 16 || len(s.slots) > 16 {
				t.Fatalf("a sketch of %d slots (cap %d), want at most 16", len(s.slots), cap(s.slots))
			}
		}
	}
}

// TestGeneratedRulesApart: the rules of one generated file (an xDS
// resource's: no line) are told apart by their resource, and found by it.
func TestGeneratedRulesApart(t *testing.T) {
	tr := NewTracker(Options{})
	now := time.Unix(1_700_000_000, 0)
	a := &descriptors.Limit{File: "limits"}
	b := &descriptors.Limit{File: "limits"}
	tr.Observe(now, "d", a, "d/user", "alice", nil, 1, Rejected)
	tr.Observe(now, "d", b, "d/path=%2Flogin", "bob", nil, 1, Rejected)
	if got := len(tr.Views(now, "d", "limits", 0)); got != 2 {
		t.Fatalf("%d rules of the file limits, want 2", got)
	}
	v := tr.Views(now, "d", "d/user", 0)
	if len(v) != 1 || v[0].Rejected.Items[0].Value != "alice" {
		t.Fatalf("rule d/user: %+v, want alice alone", v)
	}
}

// TestViewFloorBoundsTheCut: with n cutting the list, the floor still
// bounds every value not listed.
func TestViewFloorBoundsTheCut(t *testing.T) {
	tr := NewTracker(Options{})
	now := time.Unix(1_700_000_000, 0)
	l := &descriptors.Limit{File: "f", Line: 1}
	for v, hits := range map[string]uint64{"a": 9, "b": 7, "c": 2} {
		tr.Observe(now, "d", l, "d/k", v, nil, hits, Rejected)
	}
	w := tr.Views(now, "d", "", 1)[0].Rejected
	if len(w.Items) != 1 || w.Items[0].Value != "a" || w.Floor < 7 {
		t.Fatalf("top 1: %+v, want a listed and a floor of at least b's 7", w)
	}
}
