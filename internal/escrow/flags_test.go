package escrow

import (
	"flag"
	"io"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/tiers"
)

func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // "" valid, else a part of the error
	}{
		{nil, ""},
		{[]string{"--escrow", "--escrow-lease", "50ms", "--escrow-size", "demand"}, ""},
		{[]string{"--escrow-lease", "500us"}, "--escrow-lease 500µs"},
		{[]string{"--escrow-lease", "2m"}, "--escrow-lease 2m0s"},
		{[]string{"--escrow-threshold", "0"}, "--escrow-threshold 0"},
		{[]string{"--escrow-rebalance", "1ms"}, "--escrow-rebalance 1ms"},
		{[]string{"--escrow-max-keys", "0"}, "--escrow-max-keys 0"},
		{[]string{"--escrow-size", "greedy"}, `unknown lease sizing "greedy"`},
		{[]string{"--escrow-home", "redis://home:6379", "--escrow-region", "eu", "--escrow-region-lease", "5s"}, ""},
		{[]string{"--escrow-region", "eu"}, `--escrow-region "eu": needs --escrow-home`},
		{[]string{"--escrow-home", "redis://home:6379", "--escrow-region-lease", "5ms"}, "--escrow-region-lease 5ms"},
		{[]string{"--escrow-home", "redis://home:6379", "--escrow-region-lease", "2m"}, "--escrow-region-lease 2m0s"},
	} {
		f := DefaultFlags()
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		f.Bind(fs)
		err := fs.Parse(tc.args)
		if err == nil {
			err = f.Check()
		}
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%v: %v", tc.args, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%v: got %v, want an error saying %q", tc.args, err, tc.want)
		}
	}
	f := DefaultFlags()
	if f.Options.Size != SizeFair || f.Options.Lease != DefaultLease || f.Options.Default {
		t.Errorf("defaults %+v", f.Options)
	}
}

// TestOpen: Open chains the backend's SetTree before its own, registers
// the collector and runs the ticks itself.
func TestOpen(t *testing.T) {
	clk := newClock()
	mem := newMem(t)
	reg := prometheus.NewRegistry()
	var seen *descriptors.Tree
	f := DefaultFlags()
	f.Options.Default, f.Options.Now = true, clk.Now
	s, err := f.Open(Wiring{Remote: mem, Leaser: mem, SetTree: func(t *descriptors.Tree) { seen = t }, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tree := loadTree(t, "domain: api\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 10}\n")
	s.SetTree(tree)
	if seen != tree {
		t.Errorf("the backend's SetTree was not called first")
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	for _, n := range []string{"charon_escrow_decisions_total", "charon_escrow_keys", "charon_escrow_leases_total", "charon_escrow_given_back_hits_total", "charon_escrow_rebalances_total"} {
		if !names[n] {
			t.Errorf("%s not registered", n)
		}
	}
}

func loadTree(t *testing.T, text string) *descriptors.Tree {
	t.Helper()
	c, _, err := config.Load(fstest.MapFS{"api.yaml": {Data: []byte(text)}}, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return c.Tree
}

// TestRules: which policies of a configuration are leased, with the
// server's default off and on.
func TestRules(t *testing.T) {
	tree := loadTree(t, `domain: api
descriptors:
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: on
    rate_limit: {unit: minute, requests_per_unit: 100}
    escrow: true
    overrides:
      - domain: vip
        rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: off
    rate_limit: {unit: minute, requests_per_unit: 100}
    escrow: false
  - key: short
    tiers: [{limit: 100, window: 5ms}]
    escrow: true
  - key: bucket
    token_bucket: {capacity: 10, refill: 1, per: 1s}
`)
	pol := func(key string) *tiers.Policy {
		m, _ := tree.Match("api", []descriptors.Entry{{Key: key, Value: "v"}})
		return m.Policy
	}
	m, _ := tree.Match("api", []descriptors.Entry{{Key: "on", Value: "vip"}})
	vip := m.Policy
	own := sliding(100, time.Minute) // a request's own limit
	for _, def := range []bool{false, true} {
		clk := newClock()
		s := newEscrow(t, newMem(t), clk, Options{Lease: 200 * time.Millisecond})
		s.def = def
		s.SetTree(tree)
		r := s.rules.Load()
		for _, tc := range []struct {
			name string
			p    *tiers.Policy
			want bool
		}{
			{"plain", pol("plain"), def},
			{"on", pol("on"), true},
			{"on's override", vip, true},
			{"off", pol("off"), false},
			{"short", pol("short"), false},
			{"bucket", pol("bucket"), false},
			{"a request's own limit", own, false},
		} {
			if got := r.allows(tc.p, s); got != tc.want {
				t.Errorf("default %v: %s: leased %v, want %v", def, tc.name, got, tc.want)
			}
		}
	}
}
