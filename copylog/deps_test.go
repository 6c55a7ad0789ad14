package copylog

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestDeps keeps the package pure: standard library only, no clock, no
// randomness, no I/O, no goroutines, so a Lua script can mirror it and every
// result depends on the arguments alone.
func TestDeps(t *testing.T) {
	forbidden := map[string]bool{
		"math/rand": true, "math/rand/v2": true, "crypto/rand": true, "os": true, "net": true,
		"sync": true, "sync/atomic": true, "unsafe": true, "io": true, "log": true, "log/slog": true,
	}
	forbiddenCalls := map[string]bool{
		"time.Now": true, "time.Since": true, "time.Until": true, "time.Sleep": true, "time.After": true,
		"time.Tick": true, "time.NewTimer": true, "time.NewTicker": true, "time.AfterFunc": true,
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	n := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		n++
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if strings.Contains(strings.Split(path, "/")[0], ".") {
				t.Errorf("%s imports %q: only the standard library is allowed", name, path)
			}
			if forbidden[path] {
				t.Errorf("%s imports %q: the package must stay pure", name, path)
			}
		}
		ast.Inspect(f, func(node ast.Node) bool {
			switch x := node.(type) {
			case *ast.GoStmt:
				t.Errorf("%s: go statement at %v", name, fset.Position(x.Pos()))
			case *ast.SelectorExpr:
				if id, ok := x.X.(*ast.Ident); ok && forbiddenCalls[id.Name+"."+x.Sel.Name] {
					t.Errorf("%s: %s.%s at %v: time is a parameter", name, id.Name, x.Sel.Name, fset.Position(x.Pos()))
				}
			}
			return true
		})
	}
	if n == 0 {
		t.Fatal("no source files found")
	}
}
