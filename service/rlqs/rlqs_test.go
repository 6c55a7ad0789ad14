package rlqs

import (
	"context"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/internal/rlqs"
	"github.com/charonlimit/charon/internal/sharestore"
	"github.com/charonlimit/charon/server"
)

type rlqsClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *rlqsClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *rlqsClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// rlqsServer serves RLQS over a memory store on a fake clock: the
// allocator's own ticks change nothing until the test moves the clock and
// ticks.
func rlqsServer(t *testing.T) (*server.Server, *rlqs.Allocator, *rlqsClock, rlqsv3.RateLimitQuotaServiceClient) {
	t.Helper()
	cfg, _, err := config.Load(fstest.MapFS{"web.yaml": {Data: []byte(`
domain: web
descriptors:
  - key: api
    value: search
    rate_limit: {unit: second, requests_per_unit: 100}
`)}}, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	eng := engine.New(engine.Options{})
	eng.SetTree(cfg.Tree)
	clk := &rlqsClock{t: time.Unix(1_700_000_000, 0)}
	a, err := rlqs.New(rlqs.Options{Store: &sharestore.Memory{}, Tree: eng.Tree, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	s, err := server.New(server.Options{GRPCAddr: "127.0.0.1:0", Engine: eng}, New(a))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	cc, err := grpc.NewClient("passthrough:///"+s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return s, a, clk, rlqsv3.NewRateLimitQuotaServiceClient(cc)
}

type quotaStream = grpc.BidiStreamingClient[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]

func openQuota(t *testing.T, c rlqsv3.RateLimitQuotaServiceClient) (quotaStream, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	st, err := c.StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st, cancel
}

func sendUsage(t *testing.T, st quotaStream, bucket map[string]string, elapsed time.Duration, allowed, denied uint64) {
	t.Helper()
	err := st.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "web", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
		BucketId: &rlqsv3.BucketId{Bucket: bucket}, TimeElapsed: durationpb.New(elapsed), NumRequestsAllowed: allowed, NumRequestsDenied: denied}}})
	if err != nil {
		t.Fatal(err)
	}
}

// recvBucket receives one response and returns its one token bucket's
// tokens per fill and TTL, checking it against the proto's rules.
func recvBucket(t *testing.T, st quotaStream) (tokens uint32, fill, ttl time.Duration) {
	t.Helper()
	r, err := st.Recv()
	if err != nil {
		t.Fatalf("Recv: %v", err)
	}
	if err := r.Validate(); err != nil {
		t.Fatalf("response %v: %v", r, err)
	}
	if len(r.BucketAction) != 1 {
		t.Fatalf("response %v: want one bucket action", r)
	}
	qa := r.BucketAction[0].GetQuotaAssignmentAction()
	tb := qa.GetRateLimitStrategy().GetTokenBucket()
	// A limit per second is split in tokens per 10 s; an Envoy whose
	// demand is not known yet holds a quarter of a second's share.
	if perSecond := tb.GetTokensPerFill().GetValue() / uint32(max(tb.GetFillInterval().GetSeconds(), 1)); tb == nil || tb.GetMaxTokens() != (perSecond+3)/4 {
		t.Fatalf("response %v: want a token bucket holding a quarter of a second's share", r)
	}
	return tb.GetTokensPerFill().GetValue(), tb.GetFillInterval().AsDuration(), qa.GetAssignmentTimeToLive().AsDuration()
}

// waitStreams waits until the allocator has n streams open.
func waitStreams(t *testing.T, a *rlqs.Allocator, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); a.Stats(false).Streams != n; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("streams: %d, want %d", a.Stats(false).Streams, n)
		}
	}
}

// TestRLQSStream: reports in, assignments out, over the real stream: a
// starting share at once, a split when a second Envoy joins, a renewal
// before the TTL, and a lost stream's share reclaimed after the TTL.
func TestRLQSStream(t *testing.T) {
	_, a, clk, c := rlqsServer(t)
	search := map[string]string{"api": "search"}
	type tb struct {
		tokens    uint32
		fill, ttl time.Duration
	}
	want := func(st quotaStream, what string, w tb) {
		t.Helper()
		tokens, fill, ttl := recvBucket(t, st)
		if got := (tb{tokens, fill, ttl}); got != w {
			t.Fatalf("%s: got %+v, want %+v", what, got, w)
		}
	}
	sa, cancelA := openQuota(t, c)
	sendUsage(t, sa, search, 0, 3, 0)
	want(sa, "first Envoy", tb{1000, 10 * time.Second, 3 * time.Second})
	sb, _ := openQuota(t, c)
	sendUsage(t, sb, search, 0, 0, 0)
	want(sb, "second Envoy", tb{500, 10 * time.Second, 3 * time.Second})
	want(sa, "first Envoy, shrunk", tb{500, 10 * time.Second, 3 * time.Second})
	if x := a.Explain("web", search); x.Rule != "web/api=search" || x.Limit != 1000 || x.Fill != "10s" || x.PerSecond != 100 ||
		len(x.Shares) != 2 || x.Shares[0].Share != 50 {
		t.Errorf("Explain: %+v, want rule web/api=search, limit 1000 per 10s (100 per second), two shares of 50", x)
	}

	// The first Envoy's stream is lost: its 50 count until its TTL.
	cancelA()
	waitStreams(t, a, 1)
	for i := 1; i <= 3; i++ {
		clk.Advance(time.Second)
		a.Tick(context.Background())
		switch i {
		case 2:
			want(sb, "renewed before the TTL", tb{500, 10 * time.Second, 3 * time.Second})
		case 3:
			want(sb, "the lost share reclaimed after the TTL", tb{1000, 10 * time.Second, 3 * time.Second})
		}
	}
}

// TestRLQSBadReports: an empty bucket id or domain ends the stream with
// InvalidArgument; an unknown domain gets the fallback.
func TestRLQSBadReports(t *testing.T) {
	_, _, _, c := rlqsServer(t)
	st, _ := openQuota(t, c)
	if err := st.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "nope", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
		BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"a": "b"}}, NumRequestsAllowed: 1 << 63, NumRequestsDenied: 1 << 63}}}); err != nil {
		t.Fatal(err)
	}
	r, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	qa := r.GetBucketAction()[0].GetQuotaAssignmentAction()
	if qa.GetRateLimitStrategy().GetBlanketRule().String() != "ALLOW_ALL" || qa.GetAssignmentTimeToLive().AsDuration() != time.Minute {
		t.Errorf("unknown domain: %v, want ALLOW_ALL for a minute", r)
	}
	for _, m := range []*rlqsv3.RateLimitQuotaUsageReports{
		{Domain: "web", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{}}},
		{BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"a": "b"}}}}},
	} {
		st, _ := openQuota(t, c)
		if err := st.Send(m); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); status.Code(err) != codes.InvalidArgument {
			t.Errorf("report %v: got %v, want InvalidArgument", m, err)
		}
	}
}
