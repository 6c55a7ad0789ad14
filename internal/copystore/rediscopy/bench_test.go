package rediscopy

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/charonlimit/charon/copylog"
	"github.com/charonlimit/charon/internal/redistest"
)

// BenchmarkReserveRelease: a reserve of one copy and its release, two
// FCALLs, on a resource holding 0 or 100 other holds (every call decodes
// and encodes the whole copy log), from parallel goroutines (Redis clock).
func BenchmarkReserveRelease(b *testing.B) {
	for _, held := range []int{0, 100} {
		b.Run("holds="+strconv.Itoa(held), func(b *testing.B) { benchReserveRelease(b, held) })
	}
}

func benchReserveRelease(b *testing.B, held int) {
	s := New(redistest.Client(b, redistest.Single(b)), Options{})
	ctx := context.Background()
	cfg := &copylog.Config{DomainLimit: 1 << 40}
	for i := 0; i < held; i++ {
		if _, err := s.Reserve(ctx, time.Now(), "bench", cfg, copylog.ReserveRequest{Domain: "d", Copies: 1, HoldID: "base" + strconv.Itoa(i), Lease: time.Hour}); err != nil {
			b.Fatal(err)
		}
	}
	var seq atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			id := "h" + strconv.FormatInt(seq.Add(1), 10)
			r, err := s.Reserve(ctx, time.Now(), "bench", cfg, copylog.ReserveRequest{Domain: "d", Copies: 1, HoldID: id, Lease: time.Minute})
			if err != nil || !r.OK {
				b.Fatal(r, err)
			}
			if _, err := s.Release(ctx, time.Now(), "bench", id, 0); err != nil {
				b.Fatal(err)
			}
		}
	})
}
