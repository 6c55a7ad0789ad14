package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/internal/decisionlog"
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/internal/replay"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/server"
	"github.com/charonlimit/charon/service/rls"
)

const replayConfig = `domain: api
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: path
    value: /login
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 20}
  - key: internal
    rate_limit: {unlimited: true}
`

// replayTightened lowers the per-user limit and adds a limit on
// internal traffic.
const replayTightened = `domain: api
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: path
    value: /login
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 20}
  - key: internal
    rate_limit: {unit: second, requests_per_unit: 4}
`

// fakeClock is the live engine's clock, moved by the test.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

type liveRequest struct {
	at   time.Time
	req  *rlsv3.RateLimitRequest
	over bool
}

// traffic draws a minute of requests from ten users, some with a
// /login descriptor beside the user's, some with an internal one.
func traffic(seed uint64) []liveRequest {
	r := rand.New(rand.NewPCG(seed, 1))
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	var out []liveRequest
	for range 3000 {
		at = at.Add(time.Duration(r.IntN(40_000)) * time.Microsecond)
		user := fmt.Sprintf("u%d", min(r.IntN(12), 9)) // u9 three times as busy
		d := []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: user}}}}
		switch r.IntN(8) {
		case 0:
			d = append(d, &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "path", Value: "/login"}, {Key: "user", Value: user}}})
		case 1:
			d = append(d, &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "internal", Value: "x"}}})
		}
		out = append(out, liveRequest{at: at, req: &rlsv3.RateLimitRequest{Domain: "api", Descriptors: d, HitsAddend: uint32(r.IntN(2))}})
	}
	return out
}

// live serves cfg on a fake clock with a complete decision log, sends the
// requests in order, each at its time, and returns the log and the
// answers (per request, and the count of each rejected descriptor).
func live(t *testing.T, cfgText string, reqs []liveRequest) (log []byte, over []bool, rejected map[string]int64) {
	t.Helper()
	cfg := mustConfig(t, cfgText)
	clock := &fakeClock{}
	eng := engine.New(engine.Options{Store: memstore.New(memstore.Options{}), Now: clock.now})
	eng.SetTree(cfg.Tree)
	var buf bytes.Buffer
	dl := decisionlog.New(&buf, decisionlog.Options{All: true, Rate: -1})
	srv, err := server.New(server.Options{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", DebugAddr: "127.0.0.1:0", Engine: eng}, rls.New(eng, rls.Options{DecisionLog: dl}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	c := rlsv3.NewRateLimitServiceClient(conn)
	rejected = map[string]int64{}
	for _, q := range reqs {
		clock.set(q.at)
		resp, err := c.ShouldRateLimit(context.Background(), q.req)
		if err != nil {
			t.Fatal(err)
		}
		over = append(over, resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT)
		for i, st := range resp.GetStatuses() {
			if st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
				var kv []string
				for _, e := range q.req.Descriptors[i].GetEntries() {
					kv = append(kv, e.GetKey()+"="+e.GetValue())
				}
				rejected[strings.Join(kv, ",")]++
			}
		}
	}
	conn.Close()
	cancel()
	<-done
	dl.Close()
	return buf.Bytes(), over, rejected
}

func mustConfig(t *testing.T, text string) *config.Config {
	t.Helper()
	cfg, _, err := config.Load(config.DirFS(writeConfig(t, map[string]string{"api.yaml": text})), config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func runReplayOf(t *testing.T, log []byte, opts replay.Options) *replay.Report {
	t.Helper()
	l, err := replay.Read(bytes.NewReader(log))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := replay.Run(context.Background(), l, opts)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// TestReplayAgreesWithLive: a complete log replayed under the
// configuration it was recorded with changes no answer; replayed under a
// tightened one, it rejects exactly what a live server of the tightened
// configuration, fed the same requests at the same times, rejects; and
// the same log and configurations give the same report.
func TestReplayAgreesWithLive(t *testing.T) {
	reqs := traffic(7)
	logA, overA, _ := live(t, replayConfig, reqs)
	_, overB, rejectedB := live(t, replayTightened, reqs)
	a, b := mustConfig(t, replayConfig), mustConfig(t, replayTightened)

	same := runReplayOf(t, logA, replay.Options{Candidate: a})
	if !same.Log.Complete || same.Log.Missing != 0 || same.Requests != len(reqs) {
		t.Fatalf("log %+v, %d requests: want complete, all %d", same.Log, same.Requests, len(reqs))
	}
	if same.NewlyRejected != 0 || same.NewlyGranted != 0 {
		t.Errorf("replayed under its own configuration, %d requests newly rejected and %d newly granted: want none", same.NewlyRejected, same.NewlyGranted)
	}
	for _, r := range same.Rules {
		if r.Baseline.Rejected != r.Candidate.Rejected || r.Baseline.Granted != r.Candidate.Granted {
			t.Errorf("rule %s: recorded %+v, replayed %+v", r.Descriptor, r.Baseline, r.Candidate)
		}
	}

	tight := runReplayOf(t, logA, replay.Options{Candidate: b, Top: 0})
	got := map[string]int64{}
	for _, r := range tight.Rules {
		for _, c := range r.Candidate.TopRejected {
			got[c.Descriptor] += c.Count
		}
	}
	if d := cmp.Diff(rejectedB, got); d != "" {
		t.Errorf("descriptors the replay rejects under the tightened configuration (-live +replay):\n%s", d)
	}
	var newly, granted int64
	for i := range reqs {
		if !overA[i] && overB[i] {
			newly++
		}
		if overA[i] && !overB[i] {
			granted++
		}
	}
	if tight.NewlyRejected != newly || tight.NewlyGranted != granted || newly == 0 {
		t.Errorf("newly rejected %d, granted %d; live runs: %d and %d (want some)", tight.NewlyRejected, tight.NewlyGranted, newly, granted)
	}

	t.Logf("%d requests: %d newly rejected, %d newly granted; %d descriptors rejected live under the tightened configuration", len(reqs), newly, granted, len(rejectedB))
	against := runReplayOf(t, logA, replay.Options{Candidate: b, Against: a, Top: 0})
	if against.NewlyRejected != newly || against.NewlyGranted != granted {
		t.Errorf("with --against: newly rejected %d, granted %d; want %d and %d", against.NewlyRejected, against.NewlyGranted, newly, granted)
	}
	if d := cmp.Diff(against, runReplayOf(t, logA, replay.Options{Candidate: b, Against: a, Top: 0})); d != "" {
		t.Errorf("two replays of one log differ:\n%s", d)
	}
}

func TestReplayVerb(t *testing.T) {
	log, _, _ := live(t, replayConfig, traffic(3)[:500])
	logPath := writeConfig(t, map[string]string{"d.jsonl": string(log)}) + "/d.jsonl"
	a := writeConfig(t, map[string]string{"api.yaml": replayConfig})
	b := writeConfig(t, map[string]string{"api.yaml": replayTightened})
	tests := []struct {
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{[]string{"replay", "--log", logPath, "--config", b}, 0, "api: user  ", ""},
		{[]string{"replay", "--log", logPath, "--config", b}, 0, "complete", ""},
		{[]string{"replay", "--log", logPath, "--config", b, "--against", a}, 0, "newly rejected: user=", ""},
		{[]string{"replay", "--log", logPath, "--config", b, "--json"}, 0, `"newly_rejected":`, ""},
		{[]string{"replay", "--config", b}, 2, "", "needs --log"},
		{[]string{"replay", "--log", logPath + ".none", "--config", b}, 1, "", "no such file"},
	}
	for _, tc := range tests {
		var out, errb bytes.Buffer
		code := run(tc.args, func(string) string { return "" }, &out, &errb)
		if code != tc.code || !strings.Contains(out.String(), tc.stdout) || !strings.Contains(errb.String(), tc.stderr) {
			t.Errorf("charon %v: exit %d, stdout %q, stderr %q; want exit %d, stdout with %q, stderr with %q",
				tc.args, code, out.String(), errb.String(), tc.code, tc.stdout, tc.stderr)
		}
	}
	var out bytes.Buffer
	run([]string{"replay", "--log", logPath, "--config", b, "--against", a}, func(string) string { return "" }, &out, &out)
	t.Logf("\n%s", out.String())
}
