package charon

import (
	"context"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
	"github.com/charonlimit/charon/internal/copystore/memcopy"
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/internal/holds"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/server"
	"github.com/charonlimit/charon/service/rls"
)

// benchConn serves one server (engine over a memstore and a memcopy) with
// the charon.v1 and the RLS services (package service/rls, beside this
// one in the process as in charon serve) on loopback, so the figures
// compare the two APIs through the same gRPC stack, engine and stores.
func benchConn(b *testing.B) *grpc.ClientConn {
	b.Helper()
	copies := memcopy.New(memcopy.Options{})
	b.Cleanup(func() { copies.Close() })
	st := memstore.New(memstore.Options{})
	b.Cleanup(func() { st.Close() })
	eng := engine.New(engine.Options{Store: st})
	eng.SetTree(charonTree(b))
	broker := holds.New(holds.Options{Copies: copies, Tree: eng.Tree})
	s, err := server.New(server.Options{GRPCAddr: "127.0.0.1:0", Engine: eng}, New(eng, broker, Options{}), rls.New(eng, rls.Options{}))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	b.Cleanup(func() {
		cancel()
		<-done
	})
	return dial(b, s.GRPCAddr())
}

// BenchmarkCopiesVsRLS measures, through one server, one ShouldRateLimit,
// a unary Reserve+Release pair, and the same pair on a Session stream.
// The target: a pair costs at most twice one ShouldRateLimit.
func BenchmarkCopiesVsRLS(b *testing.B) {
	cc := benchConn(b)
	ctx := context.Background()
	b.Run("ShouldRateLimit", func(b *testing.B) {
		c := rlsv3.NewRateLimitServiceClient(cc)
		req := &rlsv3.RateLimitRequest{Domain: "c", Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "fast", Value: "u"}}}}}
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				r, err := c.ShouldRateLimit(ctx, req)
				if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
					b.Fatalf("%v, %v", r, err)
				}
			}
		})
	})
	b.Run("ReserveRelease", func(b *testing.B) {
		c := charonv1.NewCharonClient(cc)
		req := &charonv1.ReserveRequest{Resource: res("c", "big", "u"), Copies: 1}
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				r, err := c.Reserve(ctx, req)
				if err != nil || !r.Ok {
					b.Fatalf("%v, %v", r, err)
				}
				if _, err := c.Release(ctx, &charonv1.ReleaseRequest{HoldId: r.HoldId}); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
	b.Run("SessionReserveRelease", func(b *testing.B) {
		c := charonv1.NewCharonClient(cc)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			sctx, cancel := context.WithTimeout(ctx, time.Hour)
			defer cancel()
			st, err := c.Session(sctx)
			if err != nil {
				b.Error(err)
				return
			}
			reserve := &charonv1.SessionRequest{Operation: &charonv1.SessionRequest_Reserve{Reserve: &charonv1.ReserveRequest{Resource: res("c", "big", "u"), Copies: 1}}}
			for pb.Next() {
				reserve.Id++
				if err := st.Send(reserve); err != nil {
					b.Error(err)
					return
				}
				r, err := st.Recv()
				if err != nil || !r.GetReserve().GetOk() {
					b.Errorf("%v, %v", r, err)
					return
				}
				rel := &charonv1.SessionRequest{Id: reserve.Id, Operation: &charonv1.SessionRequest_Release{Release: &charonv1.ReleaseRequest{HoldId: r.GetReserve().GetHoldId()}}}
				if err := st.Send(rel); err != nil {
					b.Error(err)
					return
				}
				if _, err := st.Recv(); err != nil {
					b.Error(err)
					return
				}
			}
			st.CloseSend()
		})
	})
}
