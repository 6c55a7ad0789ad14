package suggest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/decisionlog"
)

// ruleConfig is the configuration ruleLog is recorded under: /login 5 per
// minute, other paths 100 per second, a shadow rule per user, an unlimited
// internal key and a wildcard over images.
const ruleConfig = `domain: api
descriptors:
  - key: path
    value: /login
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: path
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: user
    rate_limit: {unit: second, requests_per_unit: 50}
    shadow_mode: true
  - key: internal
    rate_limit: {unlimited: true}
  - key: file
    value: "img/*"
    tiers:
      - limit: 40
        window: 1s
`

func loadFS(t *testing.T, fsys fstest.MapFS) *config.Config {
	t.Helper()
	cfg, _, err := config.Load(fsys, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// ruleLog is 10 minutes of traffic as charon serve logs it under
// ruleConfig: ten clients log in twice a minute (one four times), paths
// /a and /b at 12 per second, users at 3 per second, images at 20 per
// second.
func ruleLog(t *testing.T, cfg *config.Config) []byte {
	t.Helper()
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	write := func(at time.Duration, key, value string) {
		es := []descriptors.Entry{{Key: key, Value: value}}
		m, ok := cfg.Tree.Match("api", es)
		r := decisionlog.Record{Time: t0.Add(at), RLSDomain: "api", Entries: []decisionlog.Entry{{Key: key, Value: value}},
			Hits: 1, Granted: 1, Result: decisionlog.ResultGranted, Weight: 1}
		if ok {
			r.Resource, r.Domain = m.Resource, m.Domain
		}
		if ok && m.Limit.Unlimited {
			r.Result = decisionlog.ResultNotLimited
		}
		if err := enc.Encode(&r); err != nil {
			t.Fatal(err)
		}
	}
	for ms := 0; ms < 600_000; ms += 250 {
		at := time.Duration(ms) * time.Millisecond
		write(at, "path", "/a")
		write(at, "path", "/b")
		write(at, "internal", "x")
		if ms%1000 == 0 {
			write(at, "user", "alice")
		}
		if ms%30_000 == 0 {
			for c := range 10 {
				write(at+time.Duration(c)*time.Millisecond, "path", "/login")
			}
		}
		if ms%15_000 == 0 {
			write(at, "path", "/login")
		}
		write(at, "file", "img/1.png")
	}
	return b.Bytes()
}

func TestSuggestGroupsByRule(t *testing.T) {
	fsys := fstest.MapFS{"api.yaml": {Data: []byte(ruleConfig)}}
	cfg := loadFS(t, fsys)
	log := ruleLog(t, cfg)

	// Without the configuration: the rules' paths come from the log.
	ps, err := Suggest(bytes.NewReader(log), Options{Reject: 0})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range ps {
		got = append(got, p.Descriptor())
	}
	if want := []string{"file=img/*", "path", "path=/login", "user"}; !cmp.Equal(got, want) {
		t.Errorf("groups %q, want %q (fixed values and wildcards kept; unlimited lines left out)", got, want)
	}
	files, err := Files(ps)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := config.Load(fstest.MapFS{"api.yaml": {Data: files["api.yaml"]}}, config.Options{}); err != nil {
		t.Fatalf("the proposal does not load: %v\n%s", err, files["api.yaml"])
	}
	if !strings.Contains(string(files["api.yaml"]), "value: /login") {
		t.Errorf("the /login rule lost its value:\n%s", files["api.yaml"])
	}

	// With it: each rule over its own window, everything else kept.
	ps, err = Suggest(bytes.NewReader(log), Options{Reject: 0, Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	byDesc := map[string]Proposal{}
	for _, p := range ps {
		byDesc[p.Descriptor()] = p
	}
	if p := byDesc["path=/login"]; p.Limit != 24 || p.Window != time.Minute || p.Rejected != 0 {
		t.Errorf("/login: %+v, want 24 per 1m (every login shares the rule: it has no Charon domain)", p)
	}
	if p := byDesc["path"]; p.Limit != 4 || p.Window != time.Second {
		t.Errorf("path: %+v, want 4 per 1s", p)
	}
	if p := byDesc["file=img/*"]; p.Limit != 4 || p.Policy == nil || len(p.Policy.Tiers) != 1 {
		t.Errorf("file=img/*: %+v, want 4 per 1s", p)
	}
	if p := byDesc["user"]; !p.Shadow {
		t.Errorf("user: %+v, want shadow kept", p)
	}
	out, unplaced, err := Edit(fsys, cfg, ps)
	if err != nil || len(unplaced) != 0 {
		t.Fatalf("Edit: %v, unplaced %+v", err, unplaced)
	}
	newFS := fstest.MapFS{}
	for name, b := range out {
		newFS[name] = &fstest.MapFile{Data: b}
	}
	next := loadFS(t, newFS)
	d := config.Compare(cfg, next)
	if len(d.Domains) != 0 || len(d.Moved) != 0 {
		t.Errorf("Edit changed more than limits: %+v", d)
	}
	var changed []string
	for _, r := range d.Rules {
		if r.Kind != config.Changed || len(r.Changes) != 1 || r.Changes[0].Field != "limit" {
			t.Errorf("Edit changed more than a limit: %+v", r)
		}
		changed = append(changed, r.Descriptor+": "+r.Changes[0].Old+" -> "+r.Changes[0].New)
	}
	want := []string{"file=img/*: 40 per 1s -> 4 per 1s", "path: 100 per 1s -> 4 per 1s", "path=/login: 5 per 1m -> 24 per 1m", "user: 50 per 1s -> 1 per 1s"}
	if diff := cmp.Diff(want, changed); diff != "" {
		t.Errorf("changes (-want +got):\n%s\n%s", diff, out["api.yaml"])
	}
}

// TestSmallestLimitProperty: the proposed limit is the smallest whose
// replay rejects at most the allowed share, as a search of every limit
// from 1 finds it.
func TestSmallestLimitProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for i := range 500 {
		g := &group{rls: "d", path: []descriptors.Entry{{Key: "k"}}}
		at := int64(0)
		maxHits := []int64{1, 1, 3, 10}[r.IntN(4)]
		for range 1 + r.IntN(80) {
			at += r.Int64N(300_000)
			g.events = append(g.events, event{at: at, domain: fmt.Sprint(r.IntN(3)), hits: 1 + r.Int64N(maxHits)})
		}
		reject := []float64{0, 0.01, 0.05, 0.2, 0.5}[r.IntN(5)]
		p := propose(g, Options{Reject: reject, Window: time.Second})
		allowed := int64(reject * float64(p.Hits))
		pol := func(n int64) int64 { return replay(g.events, oneTierPolicy(n, time.Second)) }
		brute := int64(1)
		for pol(brute) > allowed {
			brute++
		}
		if p.Limit != brute || p.Rejected != pol(brute) {
			t.Fatalf("draw %d (reject %v of %d hits, events %v): proposed %d rejecting %d, the smallest is %d rejecting %d",
				i, reject, p.Hits, g.events, p.Limit, p.Rejected, brute, pol(brute))
		}
	}
}
