package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/charonlimit/charon/internal/redistest"
)

// quotaEnvoy is one simulated rate_limit_quota filter: it reports its
// bucket every second as demanding a lot, and keeps the latest assignment.
type quotaEnvoy struct {
	mu     sync.Mutex
	tokens int64 // latest token bucket's tokens per second; 0: none or deny
	seen   bool
	err    error
}

func (e *quotaEnvoy) latest() (int64, bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.tokens, e.seen, e.err
}

func runQuotaEnvoy(ctx context.Context, t *testing.T, addr string) *quotaEnvoy {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	st, err := rlqsv3.NewRateLimitQuotaServiceClient(cc).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	e := &quotaEnvoy{}
	report := func(elapsed time.Duration, n uint64) error {
		return st.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "web", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
			BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"api": "search"}}, TimeElapsed: durationpb.New(elapsed), NumRequestsAllowed: n}}})
	}
	if err := report(0, 0); err != nil {
		t.Fatal(err)
	}
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if report(time.Second, 500) != nil {
					return
				}
			}
		}
	}()
	go func() {
		for {
			r, err := st.Recv()
			e.mu.Lock()
			if err != nil {
				e.err = err
				e.mu.Unlock()
				return
			}
			for _, a := range r.GetBucketAction() {
				e.seen = true
				tb := a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
				e.tokens = int64(tb.GetTokensPerFill().GetValue()) / max(tb.GetFillInterval().GetSeconds(), 1)
			}
			e.mu.Unlock()
		}
	}()
	return e
}

// TestRLQSRedisProcesses runs two `charon serve --store redis` processes
// on one Redis, three simulated Envoys on each: the leases in Redis never
// sum above the limit, the six shares converge to a sixth each, and when a
// process dies its Envoys' shares go to the others once their TTL is over.
func TestRLQSRedisProcesses(t *testing.T) {
	r := redistest.Single(t)
	bin := buildCharon(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "web.yaml"), []byte(`
domain: web
descriptors:
  - key: api
    value: search
    rate_limit: {unit: second, requests_per_unit: 100}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	url := "redis://" + r.Addr()
	a := startServe(t, bin, "--config", dir, "--store", "redis", "--redis-url", url, "--redis-timeout", "2s")
	b := startServe(t, bin, "--config", dir, "--store", "redis", "--redis-url", url, "--redis-timeout", "2s")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ctxA, killA := context.WithCancel(ctx)
	defer killA()
	var envoys []*quotaEnvoy
	for i := range 6 {
		p, c := a, ctxA
		if i%2 == 1 {
			p, c = b, ctx
		}
		envoys = append(envoys, runQuotaEnvoy(c, t, p.grpcAddr))
	}
	rc := redistest.Client(t, r)
	// checkLeases reads Redis' leases of the budget: unexpired shares must
	// never sum above the limit, 1000 tokens per 10 s (a limit per second is
	// split in tokens per 10 s).
	checkLeases := func() {
		t.Helper()
		keys, err := rc.Keys(ctx, "charon:rlqs:*").Result()
		if err != nil || len(keys) > 1 {
			t.Fatalf("budget keys %v, %v: want at most one", keys, err)
		}
		if len(keys) == 0 {
			return
		}
		now, err := rc.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		fields, err := rc.HGetAll(ctx, keys[0]).Result()
		if err != nil {
			t.Fatal(err)
		}
		var sum int64
		for _, v := range fields {
			// demand share expiry_µs
			var held, exp int64
			if f := strings.Fields(v); len(f) == 3 {
				held, exp = atoi(t, f[1]), atoi(t, f[2])
			}
			if time.UnixMicro(exp).After(now) {
				sum += held
			}
		}
		if sum > 1000 {
			t.Fatalf("leases in Redis sum to %d > 1000: %v", sum, fields)
		}
	}
	// waitShares polls until the envoys' latest shares satisfy ok.
	waitShares := func(what string, es []*quotaEnvoy, ok func([]int64) bool) {
		t.Helper()
		var got []int64
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			checkLeases()
			got = got[:0]
			for _, e := range es {
				n, _, err := e.latest()
				if err != nil {
					t.Fatalf("%s: stream: %v", what, err)
				}
				got = append(got, n)
			}
			if ok(got) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: shares %v", what, got)
			}
		}
	}
	sixth := func(s []int64) bool {
		var sum int64
		for _, n := range s {
			if n < 15 || n > 18 {
				return false
			}
			sum += n
		}
		return sum <= 100
	}
	waitShares("six Envoys on two processes", envoys, sixth)

	// Process a dies: its Envoys' streams end with it.
	a.cmd.Process.Kill()
	<-a.exited
	a.exited <- nil
	killA()
	survivors := []*quotaEnvoy{envoys[1], envoys[3], envoys[5]}
	waitShares("after a process died", survivors, func(s []int64) bool {
		var sum int64
		for _, n := range s {
			if n < 31 {
				return false
			}
			sum += n
		}
		return sum <= 100
	})
	b.alive(t)
}

func atoi(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestRLQSProcess runs the binary on the memory store: an unknown domain
// gets the fallback at once, a limited bucket its share once the restart
// hold (a TTL) is over; with --rlqs-restart-hold=false at once.
func TestRLQSProcess(t *testing.T) {
	bin := buildCharon(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "web.yaml"), []byte("domain: web\ndescriptors:\n  - key: api\n    value: search\n    rate_limit: {unit: second, requests_per_unit: 100}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, hold := range []bool{true, false} {
		// Taken before the process starts, so that the hold (which begins
		// inside it) is under the time measured, however slow the start.
		started := time.Now()
		p := startServe(t, bin, "--config", dir, fmt.Sprintf("--rlqs-restart-hold=%v", hold))
		cc, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		st, err := rlqsv3.NewRateLimitQuotaServiceClient(cc).StreamRateLimitQuotas(ctx)
		if err != nil {
			t.Fatal(err)
		}
		send := func(domain string, bucket map[string]string) {
			t.Helper()
			if err := st.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: domain, BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
				BucketId: &rlqsv3.BucketId{Bucket: bucket}, TimeElapsed: durationpb.New(0), NumRequestsAllowed: 1}}}); err != nil {
				t.Fatal(err)
			}
		}
		send("nope", map[string]string{"api": "search"})
		r, err := st.Recv()
		if err != nil || r.GetBucketAction()[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetBlanketRule().String() != "ALLOW_ALL" {
			t.Fatalf("hold %v: unknown domain: %v, %v; want ALLOW_ALL", hold, r, err)
		}
		send("web", map[string]string{"api": "search"})
		r, err = st.Recv()
		if err != nil {
			t.Fatalf("hold %v: %v\n%s", hold, err, p.stderr.String())
		}
		tb := r.GetBucketAction()[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
		if tb.GetTokensPerFill().GetValue() != 1000 || tb.GetFillInterval().AsDuration() != 10*time.Second {
			t.Errorf("hold %v: got %v, want 1000 tokens per 10 s (100 per second)", hold, r)
		}
		if waited := time.Since(started); hold && waited < 2*time.Second {
			t.Errorf("assigned %v after the start, within the restart hold", waited)
		}
		cancel()
		cc.Close()
		p.stop(t)
	}
}
