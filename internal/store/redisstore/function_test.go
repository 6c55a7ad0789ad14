package redisstore

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLibraryFiles: no hand-written Lua file of the package is over 800
// lines (the library is split where the Go code it ports splits), and each
// of the library's files ends with a newline, so that their concatenation
// (decideLua) never joins a file's last line to the next file's first.
func TestLibraryFiles(t *testing.T) {
	files, err := filepath.Glob("*.lua")
	if err != nil {
		t.Fatal(err)
	}
	more, err := filepath.Glob("testdata/*.lua")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 5 {
		t.Fatalf("the library's files: %v", files)
	}
	for _, f := range append(files, more...) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(b), "\n"); n > 800 {
			t.Errorf("%s: %d lines, over 800", f, n)
		}
		if !strings.HasSuffix(string(b), "\n") {
			t.Errorf("%s does not end with a newline", f)
		}
	}
	for _, part := range []string{tiersLua, paceLua, stateLua, fastpathsLua, applyLua} {
		if !strings.Contains(decideLua, part) {
			t.Fatal("decideLua misses a file")
		}
	}
}
