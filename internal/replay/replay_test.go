package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/internal/decisionlog"
	"github.com/charonlimit/charon/internal/engine"
)

var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

func loadConfig(t testing.TB, text string) *config.Config {
	t.Helper()
	cfg, _, err := config.Load(fstest.MapFS{"api.yaml": {Data: []byte(text)}}, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func encode(t testing.TB, recs ...decisionlog.Record) []byte {
	t.Helper()
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	for i := range recs {
		if err := enc.Encode(&recs[i]); err != nil {
			t.Fatal(err)
		}
	}
	return b.Bytes()
}

func line(at time.Duration, req string, result string, kv ...string) decisionlog.Record {
	r := decisionlog.Record{Time: t0.Add(at), RLSDomain: "api", Hits: 1, Result: result, Weight: 1, Request: req, Complete: req != ""}
	for i := 0; i+1 < len(kv); i += 2 {
		r.Entries = append(r.Entries, decisionlog.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return r
}

func TestRead(t *testing.T) {
	tests := []struct {
		name string
		recs []decisionlog.Record
		want []int // descriptors per request, in time order
		info LogInfo
	}{
		{"requests by name, in time order", []decisionlog.Record{
			line(2*time.Second, "a-1", "granted", "user", "x"), line(time.Second, "a-2", "granted", "user", "y"),
			line(2*time.Second, "a-1", "not_limited", "other", "z"), line(3*time.Second, "a-4", "granted", "user", "x"),
		}, []int{1, 2, 1}, LogInfo{Lines: 4, Complete: true, Missing: 1}},
		{"a sampled log: a line per request", []decisionlog.Record{
			func() decisionlog.Record { r := line(0, "", "granted", "user", "x"); r.Weight = 100; return r }(),
			line(0, "", "rejected", "user", "x"),
		}, []int{1, 1}, LogInfo{Lines: 2, Sampled: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := Read(bytes.NewReader(encode(t, tt.recs...)))
			if err != nil {
				t.Fatal(err)
			}
			var got []int
			for _, q := range l.Requests {
				got = append(got, len(q.Req.Descriptors))
			}
			if d := cmp.Diff(tt.want, got); d != "" {
				t.Errorf("descriptors per request (-want +got):\n%s", d)
			}
			if info := (LogInfo{l.Lines, l.Complete, l.Missing, l.Sampled}); info != tt.info {
				t.Errorf("log %+v, want %+v", info, tt.info)
			}
		})
	}
	for _, bad := range []string{"{nope\n", `{"rls_domain":"a"}` + "\n"} {
		if _, err := Read(strings.NewReader(bad)); err == nil || !strings.Contains(err.Error(), "line 1") {
			t.Errorf("Read(%q) = %v, want an error naming line 1", bad, err)
		}
	}
}

const benchConfig = `domain: api
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: path
    descriptors:
      - key: user
        tiers: [{limit: 10, window: 1s}, {limit: 30, window: 1s, active: 10s, cooldown: 1m}]
`

// benchLog is n complete lines from 1,000 users at 5,000 requests a
// second, one in four with a second descriptor.
func benchLog(b testing.TB, n int) []byte {
	var recs []decisionlog.Record
	for i := 0; len(recs) < n; i++ {
		at := time.Duration(i) * 200 * time.Microsecond
		req := fmt.Sprintf("r-%d", i)
		user := fmt.Sprintf("user%d", i*7919%1000)
		recs = append(recs, line(at, req, "granted", "user", user))
		if i%4 == 0 {
			recs = append(recs, line(at, req, "granted", "path", "/x", "user", user))
		}
	}
	return encode(b, recs[:n]...)
}

// BenchmarkReplay replays a complete log against a candidate and a
// baseline configuration, reading included: ns/op is per logged line.
func BenchmarkReplay(b *testing.B) {
	const n = 100_000
	log := benchLog(b, n)
	cand, base := loadConfig(b, benchConfig), loadConfig(b, strings.Replace(benchConfig, "20}", "10}", 1))
	b.ReportAllocs()
	b.SetBytes(int64(len(log)) / n)
	b.ResetTimer()
	for i := 0; i < b.N; i += n {
		l, err := Read(bytes.NewReader(log))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := Run(context.Background(), l, Options{Candidate: cand, Against: base}); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzRead: a log of any bytes is read or refused, never a panic, and what
// is read replays.
func FuzzRead(f *testing.F) {
	f.Add([]byte(`{"time":"2030-01-02T03:04:05Z","rls_domain":"api","entries":[{"key":"user","value":"x"}],"hits":1,"result":"granted","weight":1,"request":"a-1","complete":true}`))
	f.Add([]byte(`{"time":"2030-01-02T03:04:05Z","rls_domain":"api","entries":[{"key":"user","value":"x"}],"hits":3,"override":{"requests_per_unit":1,"unit":"second"}}`))
	cfg := loadConfig(f, benchConfig)
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := Read(bytes.NewReader(b))
		if err != nil {
			return
		}
		if _, err := Run(context.Background(), l, Options{Candidate: cfg, Against: cfg}); err != nil {
			t.Fatalf("a log that reads does not replay: %v", err)
		}
	})
}

// TestPacedReplayNeverSleeps: a candidate rule that paces is replayed on
// the log's clock: paced requests are granted, as the live server would
// after their wait, and nothing sleeps (the Sleep given here would hold
// until the deadline).
func TestPacedReplayNeverSleeps(t *testing.T) {
	log := encode(t, line(0, "a", "granted", "user", "u"), line(time.Millisecond, "b", "rejected", "user", "u"),
		line(2*time.Millisecond, "c", "rejected", "user", "u"))
	l, err := Read(bytes.NewReader(log))
	if err != nil {
		t.Fatal(err)
	}
	base := loadConfig(t, "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	cand := loadConfig(t, "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 1}\n    pace: 10s\n")
	slept := 0
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rep, err := Run(ctx, l, Options{Candidate: cand, Against: base, Engine: engine.Options{Sleep: func(ctx context.Context, _ time.Duration) error {
		slept++
		<-ctx.Done()
		return ctx.Err()
	}}})
	if err != nil {
		t.Fatal(err)
	}
	if slept != 0 || rep.NewlyGranted != 2 {
		t.Errorf("slept %d times, %d newly granted; want 0 and 2 (both paced)", slept, rep.NewlyGranted)
	}
}
