package suggest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/internal/decisionlog"
)

var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// trace writes 100 s of traffic on api/user: nine users at 2 requests per
// second, bob at 20 (every 50 ms), and on api/api.user one tenant at 3
// per second. 3,800 hits on user: a limit of 5 per second rejects bob's
// 1,500 (at most 40% is 1,520), 4 would reject 1,600.
func trace(t *testing.T) []byte {
	t.Helper()
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	write := func(at time.Duration, entries ...decisionlog.Entry) {
		r := decisionlog.Record{Time: t0.Add(at), RLSDomain: "api", Entries: entries, Hits: 1, Granted: 1, Result: decisionlog.ResultGranted, Weight: 1}
		if err := enc.Encode(&r); err != nil {
			t.Fatal(err)
		}
	}
	for ms := 0; ms < 100_000; ms += 50 {
		at := time.Duration(ms) * time.Millisecond
		write(at, decisionlog.Entry{Key: "user", Value: "bob"})
		if ms%500 == 0 {
			for u := range 9 {
				write(at+time.Duration(u)*time.Millisecond, decisionlog.Entry{Key: "user", Value: fmt.Sprint("u", u)})
			}
		}
		if ms%1000 == 0 {
			for k := range 3 {
				write(at+time.Duration(k)*100*time.Millisecond, decisionlog.Entry{Key: "api", Value: "v1"}, decisionlog.Entry{Key: "user", Value: "t"})
			}
		}
	}
	return b.Bytes()
}

func TestSuggestKnownAnswer(t *testing.T) {
	ps, err := Suggest(bytes.NewReader(trace(t)), Options{Reject: 0.4})
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 2 {
		t.Fatalf("%d proposals, want 2: %+v", len(ps), ps)
	}
	nested, user := ps[0], ps[1]
	if user.Descriptor() != "user" || user.Hits != 3800 || user.Domains != 10 || user.Limit != 5 || user.Rejected != 1500 ||
		user.Window != time.Second || user.Max != 20 || user.P50 != 2 {
		t.Errorf("user: %+v, want limit 5 per 1s rejecting 1500 of 3800", user)
	}
	if nested.Descriptor() != "api,user" || nested.Limit != 2 || nested.Rejected != 100 {
		t.Errorf("api.user: %+v, want limit 2 rejecting 100 of 300 (3 would reject none, 1 two thirds)", nested)
	}
	// With nothing to reject, bob's 20 per second must pass.
	ps, err = Suggest(bytes.NewReader(trace(t)), Options{Reject: 0, Window: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if u := ps[1]; u.Limit != 200 || u.Rejected != 0 || u.Window != 10*time.Second {
		t.Errorf("user with no rejection over 10s windows: %+v, want 200", u)
	}

	files, err := Files(ps)
	if err != nil {
		t.Fatal(err)
	}
	fsys := fstest.MapFS{}
	for name, b := range files {
		fsys[name] = &fstest.MapFile{Data: b}
	}
	if len(files) != 1 || files["api.yaml"] == nil {
		t.Fatalf("files %v, want api.yaml", files)
	}
	cfg, _, err := config.Load(fsys, config.Options{})
	if err != nil {
		t.Fatalf("config check refuses the proposal: %v\n%s", err, files["api.yaml"])
	}
	if _, ok := cfg.Tree.Domain("api"); !ok {
		t.Errorf("the proposal has no domain api:\n%s", files["api.yaml"])
	}
}

func TestSuggestRefusesBadInput(t *testing.T) {
	for _, tt := range []struct {
		log  string
		opts Options
		want string
	}{
		{"{not json\n", Options{}, "line 1"},
		{"{}\n{\"rls_domain\":\"a\"}\n", Options{}, "line 1: not a decision"},
		{"", Options{Reject: 1}, "[0, 1)"},
		{"", Options{Window: time.Microsecond}, "window"},
	} {
		if _, err := Suggest(strings.NewReader(tt.log), tt.opts); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Suggest(%q, %+v) = %v, want an error with %q", tt.log, tt.opts, err, tt.want)
		}
	}
}

func FuzzSuggestNeverPanics(f *testing.F) {
	f.Add([]byte(`{"time":"2030-01-02T03:04:05Z","rls_domain":"a","entries":[{"key":"k","value":"v"}],"hits":3,"weight":2.5}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ps, err := Suggest(bytes.NewReader(b), Options{Reject: 0.1})
		if err != nil {
			return
		}
		for _, p := range ps {
			if p.Rejected > int64(0.1*float64(p.Hits)) {
				t.Fatalf("proposal %+v rejects more than 10%%", p)
			}
		}
		Files(ps)
	})
}
