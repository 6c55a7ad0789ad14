package config

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/charonlimit/charon/tiers"
)

func TestLoadQuota(t *testing.T) {
	text := `domain: plans
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 10}
    quota: {limit: 10000, period: month, time_zone: America/New_York}
  - key: billing
    quota: {limit: 500, period: month, anchor: "2025-01-31T09:00:00Z"}
    overdraft: true
`
	cfg, _, err := load(t, Options{}, "plans.yaml", text)
	if err != nil {
		t.Fatal(err)
	}
	ny, _ := time.LoadLocation("America/New_York")
	m, ok := cfg.Tree.Match("plans", e("tenant", "acme"))
	if !ok || m.Policy == nil || m.Limit.Quota == nil || m.Limit.QuotaID == 0 {
		t.Fatalf("tenant: %+v", m)
	}
	if diff := cmp.Diff(tiers.Quota{Limit: 10000, Period: tiers.PeriodMonth, Location: ny}, m.Limit.Quota.Quota, cmp.Comparer(func(a, b *time.Location) bool { return a.String() == b.String() })); diff != "" {
		t.Errorf("tenant quota (-want +got):\n%s", diff)
	}
	m, ok = cfg.Tree.Match("plans", e("billing", "acme"))
	if !ok || m.Policy != nil || m.Limit.Quota == nil || !m.Limit.Quota.Overdraft || !m.Limit.Quota.Quota.Anchor.Equal(time.Date(2025, 1, 31, 9, 0, 0, 0, time.UTC)) {
		t.Fatalf("billing: %+v", m.Limit)
	}
}

func TestLoadQuotaErrors(t *testing.T) {
	tests := []struct {
		name, text string
		want       []string
	}{
		{"bad values", `
domain: api
descriptors:
  - key: a
    quota: {limit: 0, period: fortnight, time_zone: Mars/Olympus, anchor: yesterday}
`, []string{
			"api.yaml:5: descriptors[0].quota.limit: must be >= 1",
			`api.yaml:5: descriptors[0].quota.period: unknown period "fortnight" (want minute, hour, day, week, month, quarter or year)`,
			`api.yaml:5: descriptors[0].quota.time_zone: unknown time zone "Mars/Olympus" (want an IANA name such as Europe/Paris)`,
			"api.yaml:5: descriptors[0].quota.anchor: must be an RFC 3339 instant such as 2025-01-31T00:00:00-05:00",
		}},
		{"missing period, unknown key", `
domain: api
descriptors:
  - key: a
    quota: {limit: 5, every: day}
`, []string{
			`api.yaml:5: descriptors[0].quota.every: unknown key "every"`,
			"api.yaml:5: descriptors[0].quota.period: missing",
		}},
		{"hard limit without a rate policy", `
domain: api
descriptors:
  - key: a
    quota: {limit: 5, period: day}
    hard_limit: 3
`, []string{"api.yaml:6: descriptors[0].hard_limit: needs a rate policy on the same descriptor (rate_limit, tiers or token_bucket)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := load(t, Options{}, "api.yaml", tt.text)
			if err == nil {
				t.Fatal("loaded")
			}
			if diff := cmp.Diff(tt.want, strings.Split(err.Error(), "\n")); diff != "" {
				t.Errorf("errors (-want +got):\n%s", diff)
			}
		})
	}
}
