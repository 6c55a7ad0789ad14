package config

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/charonlimit/charon/descriptors"
)

// TestLoadEscrow: escrow: true|false on a descriptor, kept out of the
// policy's ID; what cannot be leased loads with a warning naming the rule
// and why; a wrong value or place is an error naming the field.
func TestLoadEscrow(t *testing.T) {
	text := `domain: api
descriptors:
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: on
    rate_limit: {unit: minute, requests_per_unit: 100}
    escrow: true
  - key: off
    rate_limit: {unit: minute, requests_per_unit: 100}
    escrow: false
  - key: short
    tiers: [{limit: 100, window: 5ms}]
    escrow: true
  - key: bucket
    token_bucket: {capacity: 10, refill: 1, per: 1s}
    escrow: true
`
	c, warns, err := load(t, Options{EscrowLease: 200 * time.Millisecond}, "api.yaml", text)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		key  string
		want descriptors.Escrow
	}{{"plain", descriptors.EscrowDefault}, {"on", descriptors.EscrowOn}, {"off", descriptors.EscrowOff}, {"short", descriptors.EscrowOn}} {
		m, ok := c.Tree.Match("api", []descriptors.Entry{{Key: tc.key, Value: "v"}})
		if !ok || m.Limit.Escrow != tc.want {
			t.Errorf("%s: escrow %v, want %v", tc.key, m.Limit.Escrow, tc.want)
		}
	}
	var got []string
	for _, w := range warns {
		got = append(got, w.String())
	}
	want := []string{
		"api.yaml:12: descriptors[3].escrow: stays on the shared store: the window 5ms is shorter than 20 leases of the shortest, 1ms",
		"api.yaml:15: descriptors[4].escrow: stays on the shared store: a token_bucket is not leased yet",
	}
	if !slices.Equal(got, want) {
		t.Errorf("warnings:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	a, _, _ := load(t, Options{}, "api.yaml", "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 10}\n")
	b, _, _ := load(t, Options{}, "api.yaml", "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 10}\n    escrow: true\n")
	ma, _ := a.Tree.Match("api", []descriptors.Entry{{Key: "a", Value: "v"}})
	mb, _ := b.Tree.Match("api", []descriptors.Entry{{Key: "a", Value: "v"}})
	if ma.Limit.ID != mb.Limit.ID || ma.Shape != mb.Shape {
		t.Errorf("escrow changed the policy's ID or shape")
	}

	// Under the server's --escrow, only a window too short is noted: a
	// kind that is never leased is documented, not warned of.
	_, warns, err = load(t, Options{Escrow: true, EscrowLease: 200 * time.Millisecond}, "api.yaml",
		"domain: api\ndescriptors:\n  - key: a\n    tiers: [{limit: 10, window: 5ms}]\n  - key: b\n    token_bucket: {capacity: 10, refill: 1, per: 1s}\n  - key: c\n    tiers: [{limit: 10, window: 5ms}]\n    escrow: false\n  - key: d\n    rate_limit: {unit: second, requests_per_unit: 10}\n")
	if err != nil || len(warns) != 1 || !strings.Contains(warns[0].String(), "api.yaml:4: descriptors[0].escrow: stays on the shared store: the window 5ms") {
		t.Errorf("server-wide escrow: got %v, %v; want one warning for the 5ms window", warns, err)
	}

	for _, tc := range []struct{ name, text, want string }{
		{"not a boolean", "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n    escrow: sometimes\n", "api.yaml:5: descriptors[0].escrow: must be true or false"},
		{"no policy", "domain: api\ndescriptors:\n  - key: a\n    escrow: true\n", "api.yaml:4: descriptors[0].escrow: needs a policy"},
		{"unlimited", "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true}\n    escrow: true\n", "api.yaml:5: descriptors[0].escrow: applies only to"},
		{"copies", "domain: api\ndescriptors:\n  - key: a\n    copies: {domain_limit: 2}\n    escrow: true\n", "api.yaml:5: descriptors[0].escrow: applies only to"},
		{"quota alone", "domain: api\ndescriptors:\n  - key: a\n    quota: {limit: 5, period: day}\n    escrow: true\n", "api.yaml:5: descriptors[0].escrow: needs a rate policy"},
	} {
		_, _, err := load(t, Options{}, "api.yaml", tc.text)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got error %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}
