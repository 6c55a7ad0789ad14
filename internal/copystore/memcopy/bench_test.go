package memcopy_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/charonlimit/charon/copylog"
	"github.com/charonlimit/charon/internal/copystore/memcopy"
)

var benchCfg = &copylog.Config{
	DomainLimit: 1 << 40,
	GlobalLimit: 1 << 40,
	Groups:      []copylog.Group{{Name: "eu", Limit: 1 << 40, Members: []string{"paris", "berlin"}}},
}

// pair reserves 2 copies and releases them, as one client's reserve and
// release of a hold.
func pair(b *testing.B, s *memcopy.Store, res, hold, session string) {
	r, err := s.Reserve(bg, t0, res, benchCfg, copylog.ReserveRequest{Domain: "paris", Copies: 2, Min: 1, HoldID: hold, Session: session, Lease: 10 * time.Second})
	if err != nil || !r.OK {
		b.Fatalf("Reserve: %+v, %v", r, err)
	}
	if _, err := s.Release(bg, t0, res, hold, 0); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkReserveRelease is a reserve and a release of one hold on a
// resource holding nothing else: the copy log is dropped empty and made
// again every time.
func BenchmarkReserveRelease(b *testing.B) {
	s := memcopy.New(memcopy.Options{})
	defer s.Close()
	b.ReportAllocs()
	for b.Loop() {
		pair(b, s, "r", "h", "s")
	}
}

// BenchmarkReserveReleaseBusy is the same pair on a resource that keeps
// 100 other holds (its copy log stays).
func BenchmarkReserveReleaseBusy(b *testing.B) {
	s := memcopy.New(memcopy.Options{})
	defer s.Close()
	for i := range 100 {
		if _, err := s.Reserve(bg, t0, "r", benchCfg, copylog.ReserveRequest{Domain: "berlin", Copies: 1, HoldID: fmt.Sprint("other", i), Lease: time.Hour}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		pair(b, s, "r", "h", "s")
	}
}

// BenchmarkReserveReleaseParallel runs pairs from GOMAXPROCS goroutines on
// one resource (one lock) or on 64 resources.
func BenchmarkReserveReleaseParallel(b *testing.B) {
	for _, resources := range []int{1, 64} {
		b.Run(fmt.Sprint("resources=", resources), func(b *testing.B) {
			s := memcopy.New(memcopy.Options{})
			defer s.Close()
			names := make([]string, resources)
			for i := range names {
				names[i] = fmt.Sprint("resource/", i)
			}
			var seq atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				n := seq.Add(1)
				hold, session := fmt.Sprint("h", n), fmt.Sprint("s", n)
				i := int(n)
				for pb.Next() {
					i++
					pair(b, s, names[i%resources], hold, session)
				}
			})
		})
	}
}
