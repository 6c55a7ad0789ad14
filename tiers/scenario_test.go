package tiers_test

import (
	"testing"

	"github.com/charonlimit/charon/tiers"
	"github.com/charonlimit/charon/tiers/tierstest"
)

// TestScenarios replays the scripts of testdata/*.txt (format: package
// tierstest), one State per domain and one Global for all. Every store
// replays them too (internal/store/storetest).
func TestScenarios(t *testing.T) {
	scripts, err := tierstest.Load("testdata")
	if err != nil {
		t.Fatal(err)
	}
	for _, sc := range scripts {
		t.Run(sc.Name, func(t *testing.T) {
			p := &sc.Policy
			states := map[string]*tiers.State{}
			g := &tiers.Global{}
			for _, st := range sc.Steps {
				s := states[st.Domain]
				if s == nil {
					s = &tiers.State{}
					states[st.Domain] = s
				}
				switch st.Op {
				case tierstest.OpRefund:
					tiers.RefundSlots(p, s, g, st.At, st.SlotsAt, st.Copies)
				case tierstest.OpForget:
					if got := tiers.ForgetAt(p, s); !got.Equal(st.Forget) {
						t.Errorf("%s: ForgetAt = %v, want %v", st.Where, got, st.Forget)
					}
				case tierstest.OpRequest:
					peek := tiers.Peek(p, s, g, st.At, st.Copies, st.Min)
					d := tiers.Request(p, s, g, st.At, st.Copies, st.Min)
					if peek != d {
						t.Fatalf("%s: Peek %+v, Request %+v", st.Where, peek, d)
					}
					for _, msg := range st.Check(d) {
						t.Errorf("%s: %s (decision %+v)", st.Where, msg, d)
					}
				}
			}
		})
	}
}

// TestScenarioDir checks that tierstest finds this package's scripts from
// anywhere, as the stores' suites need.
func TestScenarioDir(t *testing.T) {
	all, err := tierstest.LoadAll()
	if err != nil {
		t.Fatal(err)
	}
	here, err := tierstest.Load("testdata")
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != len(here) {
		t.Fatalf("tierstest.LoadAll() read %d scripts, testdata %d", len(all), len(here))
	}
}
