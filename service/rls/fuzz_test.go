package rls

import (
	"context"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/internal/store/memstore"
)

// FuzzShouldRateLimit feeds arbitrary RateLimitRequest messages (as wire
// bytes) through the real pipeline over examples/config: the server never
// panics, answers either InvalidArgument or one status per descriptor with an
// overall code of OK or OVER_LIMIT, and every status carries its remaining
// count and reset time.
func FuzzShouldRateLimit(f *testing.F) {
	cfg, _, err := config.Load(os.DirFS("../../examples/config"), config.Options{})
	if err != nil {
		f.Fatal(err)
	}
	now := time.Unix(1_900_000_000, 0)
	st := memstore.New(memstore.Options{MaxKeys: 10_000})
	f.Cleanup(func() { st.Close() })
	eng := engine.New(engine.Options{
		Store: st,
		Now:   func() time.Time { now = now.Add(7 * time.Millisecond); return now },
	})
	eng.SetTree(cfg.Tree)
	s := &Service{engine: eng, metrics: testMetrics(f), log: slog.New(slog.NewTextHandler(io.Discard, nil))}

	seeds := []*rlsv3.RateLimitRequest{
		{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "alice")}},
		{Domain: "edge_proxy", HitsAddend: 3, Descriptors: []*ratelimitv3.RateLimitDescriptor{
			desc("path", "/login"), desc("remote_address", "10.0.0.1")}},
		{Domain: "cookbook", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries:        desc("credits", "x").Entries,
			HitsAddend:     wrapperspb.UInt64(5),
			IsNegativeHits: true,
		}}},
		{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: desc("user", "bob").Entries,
			Limit:   &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_MINUTE},
		}}},
		{Domain: "", Descriptors: nil},
	}
	for _, r := range seeds {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req := &rlsv3.RateLimitRequest{}
		if proto.Unmarshal(data, req) != nil {
			return
		}
		resp, err := s.ShouldRateLimit(context.Background(), req)
		if err != nil {
			if c := status.Code(err); c != codes.InvalidArgument {
				t.Fatalf("error code %v (%v), want InvalidArgument", c, err)
			}
			return
		}
		if c := resp.GetOverallCode(); c != rlsv3.RateLimitResponse_OK && c != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("overall code %v", c)
		}
		if len(resp.GetStatuses()) != len(req.GetDescriptors()) {
			t.Fatalf("%d statuses for %d descriptors", len(resp.GetStatuses()), len(req.GetDescriptors()))
		}
		over := false
		for i, st := range resp.GetStatuses() {
			if st.GetDurationUntilReset() == nil {
				t.Fatalf("status %d has no duration_until_reset", i)
			}
			over = over || st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if over != (resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT) {
			t.Fatalf("overall code %v does not follow the statuses", resp.GetOverallCode())
		}
	})
}
