package tiers

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDeps keeps the package pure: standard library only, and no clock,
// sleep, timer or random source outside tests.
func TestDeps(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	banned := []string{"time.Now", "time.Since", "time.Until", "time.Sleep", "time.After", "time.Tick", "time.NewTimer", "time.NewTicker", "time.AfterFunc"}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		af, err := parser.ParseFile(token.NewFileSet(), f, src, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range af.Imports {
			path := strings.Trim(imp.Path.Value, `"`)
			if strings.Contains(strings.SplitN(path, "/", 2)[0], ".") {
				t.Errorf("%s imports %s: only the standard library is allowed", f, path)
			}
			if strings.HasPrefix(path, "math/rand") || path == "crypto/rand" || path == "os" || path == "net" || path == "sync" || path == "io" {
				t.Errorf("%s imports %s", f, path)
			}
		}
		for _, b := range banned {
			if strings.Contains(string(src), b) {
				t.Errorf("%s uses %s: time is a parameter", f, b)
			}
		}
		if strings.Contains(string(src), "go func") {
			t.Errorf("%s starts a goroutine", f)
		}
	}
}
