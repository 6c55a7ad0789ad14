package sim

import (
	"strings"
	"testing"
	"time"
)

var t0 = float64(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC).UnixMilli())

func pattern(t *testing.T, name string) *Lane {
	t.Helper()
	for _, p := range Patterns {
		if p.Name == name {
			l, err := Load(p.YAML)
			if err != nil {
				t.Fatalf("pattern %s: %v", name, err)
			}
			return l
		}
	}
	t.Fatalf("no pattern %s", name)
	return nil
}

// grants sends n single requests at now and returns how many were granted.
func grants(l *Lane, now float64, n int) int {
	g := 0
	for range n {
		if l.Request(now, 1).OK {
			g++
		}
	}
	return g
}

// TestPatternsBehaveAsTheSeedSays runs the seed's four patterns on the
// lane the page drives.
func TestPatternsBehaveAsTheSeedSays(t *testing.T) {
	l := pattern(t, "simple")
	if g := grants(l, t0, 6); g != 5 {
		t.Errorf("simple: %d of 6 granted in a second, want 5", g)
	}

	l = pattern(t, "penalties")
	if g := grants(l, t0, 20); g != 15 || l.State(t0).Tier != 2 {
		t.Errorf("penalties: burst granted %d, tier %d; want 5 in tier 1 and 10 in tier 2", g, l.State(t0).Tier)
	}
	for s := 1; s < 5; s++ {
		if g := grants(l, t0+float64(s*1000), 20); g != 10 {
			t.Errorf("penalties: second %d in tier 2 granted %d, want 10", s, g)
		}
	}
	for s := 5; s < 20; s++ {
		now := t0 + float64(s*1000)
		if g := grants(l, now, 20); g != 5 || l.State(now).Tier != 1 || l.State(now).Tiers[1].Phase != "cooldown" {
			t.Errorf("penalties: second %d (cooldown) granted %d, want 5 in tier 1", s, g)
		}
	}
	if g := grants(l, t0+20_000, 20); g != 15 {
		t.Errorf("penalties: after the cooldown a burst got %d, want 15 again", g)
	}

	l = pattern(t, "punishment")
	if g := grants(l, t0, 30); g != 16 || l.State(t0).Tier != 3 {
		t.Errorf("punishment: burst granted %d, tier %d; want 5 + 10 + 1 in the prison tier 3", g, l.State(t0).Tier)
	}
	for _, after := range []float64{1000, 60_000, 59 * 60_000} {
		if g := grants(l, t0+after, 5); g != 0 {
			t.Errorf("punishment: %v ms later %d granted, want none (trapped)", after, g)
		}
	}

	l = pattern(t, "batch")
	if g := grants(l, t0, 60); g != 50 {
		t.Errorf("batch: %d granted in the run, want 50", g)
	}
	for _, after := range []float64{30_000, 61_000, 30 * 60_000, 59*60_000 + 59_000} {
		if g := grants(l, t0+after, 1); g != 0 {
			t.Errorf("batch: %v ms later granted, want nothing for the rest of the hour", after)
		}
	}
	if g := grants(l, t0+3_600_000, 1); g != 1 {
		t.Errorf("batch: the next hour's first request rejected")
	}
}

func TestLoadErrorsAreConfigChecks(t *testing.T) {
	_, err := Load("key: user\ntiers:\n  - {limit: 5, window: -1s}\n")
	if err == nil || !strings.Contains(err.Error(), "sim.yaml:3: tiers[0].window: ") {
		t.Errorf("bad window: %v, want config check's file:line message", err)
	}
	if _, err := Load("key: [\n"); err == nil {
		t.Error("broken YAML accepted")
	}
	if _, err := Load("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true}\n"); err == nil || !strings.Contains(err.Error(), "no descriptor with a rate limit") {
		t.Errorf("no limit: %v", err)
	}
	l, err := Load("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 3}\n")
	if err != nil {
		t.Fatal(err)
	}
	if st := l.State(t0); st.Kind != "tiers" || st.Remaining != 3 || !strings.Contains(st.Leaf, "sim.yaml:3 a") {
		t.Errorf("a whole file: %+v", st)
	}
	if d := l.Request(t0, 4); d.OK || !d.RetryNever {
		t.Errorf("4 hits of a limit of 3: %+v, want a rejection no wait helps", d)
	}
}

func FuzzLoad(f *testing.F) {
	for _, p := range Patterns {
		f.Add(p.YAML)
	}
	f.Fuzz(func(t *testing.T, text string) {
		l, err := Load(text)
		if err != nil {
			return
		}
		l.Request(t0, 3)
		l.State(t0 + 500)
	})
}
