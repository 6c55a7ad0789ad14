package copylog

import (
	"fmt"
	"testing"
	"time"
)

func benchReserveRelease(b *testing.B, cfg *Config, others int) {
	s := &State{}
	// Other holds, so that the maps have a realistic size.
	for i := 0; i < others; i++ {
		d := fmt.Sprintf("d%d", i%50)
		if _, err := Reserve(cfg, s, t0, ReserveRequest{Domain: d, Copies: 1, HoldID: fmt.Sprintf("o%d", i),
			Session: d, Lease: time.Hour}); err != nil {
			b.Fatal(err)
		}
	}
	req := ReserveRequest{Domain: "a", Copies: 2, Min: 1, HoldID: "h", Session: "s", Lease: time.Minute}
	now := t0
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		now = now.Add(time.Microsecond)
		r, err := Reserve(cfg, s, now, req)
		if err != nil || !r.OK {
			b.Fatal(r, err)
		}
		if _, err := Release(s, now, "h", 0); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReserveRelease(b *testing.B) {
	plain := &Config{DomainLimit: 10, GlobalLimit: 100000}
	groups := &Config{DomainLimit: 10, GlobalLimit: 100000, Groups: []Group{
		{Name: "big", Limit: 50000, Members: []string{"a", "b", "c"}},
		{Name: "all", Limit: 90000, Members: []string{"x", "y", "a"}},
		{Name: "other", Limit: 10, Members: []string{"z"}},
	}}
	b.Run("plain", func(b *testing.B) { benchReserveRelease(b, plain, 0) })
	b.Run("groups", func(b *testing.B) { benchReserveRelease(b, groups, 0) })
	b.Run("groups-1000holds", func(b *testing.B) { benchReserveRelease(b, groups, 1000) })
}
