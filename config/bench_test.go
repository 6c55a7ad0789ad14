package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
)

// bigFS is 1,000 files of 100 descriptors each, in the three shapes users
// write: rate_limit in flow style, tier lists, nested token buckets.
func bigFS() fstest.MapFS {
	fsys := fstest.MapFS{}
	for f := 0; f < 1000; f++ {
		var b strings.Builder
		fmt.Fprintf(&b, "domain: d%d\ndescriptors:\n", f)
		for d := 0; d < 100; d++ {
			switch d % 3 {
			case 0:
				fmt.Fprintf(&b, "  - key: k%d\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", d, d+1)
			case 1:
				fmt.Fprintf(&b, "  - key: k%d\n    value: v%d\n    tiers:\n      - {limit: 5, window: 1s}\n      - {limit: 20, window: 1s, active: 5s, cooldown: 15s}\n", d, d)
			default:
				fmt.Fprintf(&b, "  - key: k%d\n    descriptors:\n      - key: user\n        token_bucket: {capacity: 100, refill: 1, per: 1s}\n", d)
			}
		}
		fsys[fmt.Sprintf("f%04d.yaml", f)] = &fstest.MapFile{Data: []byte(b.String())}
	}
	return fsys
}

// BenchmarkLoad1000Files loads bigFS from a directory on disk, as charon
// serve and charon config check do. The target is at most 5 s per load; the
// benchmark reports the figure and asserts nothing about time, as the
// machine may be shared.
func BenchmarkLoad1000Files(b *testing.B) {
	dir := b.TempDir()
	for name, f := range bigFS() {
		if err := os.WriteFile(filepath.Join(dir, name), f.Data, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	fsys := os.DirFS(dir)
	cfg, _, err := Load(fsys, Options{})
	if err != nil {
		b.Fatal(err)
	}
	if got := len(cfg.Tree.Domains()); got != 1000 {
		b.Fatalf("loaded %d domains, want 1000", got)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := Load(fsys, Options{}); err != nil {
			b.Fatal(err)
		}
	}
}
