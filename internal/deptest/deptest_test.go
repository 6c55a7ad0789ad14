package deptest

import (
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/charonlimit/charon"

// imports lists every package of the module (paths relative to the module)
// with the packages of the module it may import directly.
var imports = map[string][]string{
	"api/charon/v1": nil,
	"client":        {"api/charon/v1"},
	"cmd/charon": {"config", "internal/canary", "internal/clientcmd", "internal/copystore/memcopy", "internal/decisionlog", "internal/engine", "internal/escrow", "internal/gctune", "internal/holds",
		"internal/lyftenv", "internal/memlimit", "internal/offlinecmd", "internal/redisbackend", "internal/redisconn", "internal/rlqs", "internal/sharestore", "internal/statefile", "internal/statsd", "internal/statsmap", "internal/store/memstore",
		"internal/store/resilient", "internal/tracing", "internal/xdsconfig", "server", "service/charon", "service/rlqs", "service/rls"},
	"internal/canary":                    {"config", "internal/engine", "internal/store/memstore"},
	"internal/offlinecmd":                {"config", "internal/clientcmd", "internal/engine", "internal/escrowsim", "internal/replay", "internal/sim", "internal/suggest"},
	"internal/clientcmd":                 {"api/charon/v1", "client", "descriptors", "internal/gctune", "internal/loadgen", "internal/offenders", "internal/rlqssim", "internal/tlsconfig"},
	"config":                             {"descriptors", "tiers"},
	"copylog":                            nil,
	"fairshare":                          nil,
	"descriptors":                        {"tiers"},
	"internal/copystore":                 {"copylog"},
	"internal/copystore/copystoretest":   {"copylog", "internal/copystore"},
	"internal/copystore/memcopy":         {"copylog", "internal/collect", "internal/copystore", "internal/periodic"},
	"internal/copystore/rediscopy":       {"copylog", "internal/copystore", "internal/redisfunc"},
	"internal/deptest":                   nil,
	"internal/decisionlog":               nil,
	"internal/replay":                    {"config", "descriptors", "internal/decisionlog", "internal/engine", "internal/store/memstore", "tiers"},
	"internal/suggest":                   {"config", "descriptors", "internal/decisionlog", "tiers"},
	"internal/sim":                       {"config", "descriptors", "tiers"},
	"internal/sim/gen":                   nil,
	"internal/engine":                    {"descriptors", "internal/store", "tiers"},
	"internal/escrow":                    {"descriptors", "fairshare", "internal/collect", "internal/sharestore", "internal/store", "tiers"},
	"internal/escrowsim":                 {"internal/escrow", "internal/sharestore", "internal/store", "internal/store/memstore", "tiers"},
	"internal/holds":                     {"copylog", "descriptors", "internal/copystore"},
	"internal/gctune":                    nil,
	"internal/sharestore":                {"fairshare"},
	"internal/rlqssim":                   nil,
	"internal/rlqs":                      {"descriptors", "fairshare", "internal/sharestore", "tiers"},
	"internal/sharestore/redisshare":     {"fairshare", "internal/sharestore"},
	"internal/sharestore/sharestoretest": {"fairshare", "internal/sharestore"},
	"internal/escrow/pooltest":           {"internal/escrow"},
	"internal/loadgen":                   {"api/charon/v1"},
	"internal/lru":                       nil,
	"internal/memlimit":                  {"internal/gctune"},
	"internal/offenders":                 {"descriptors"},
	"internal/lyftenv":                   nil,
	"internal/periodic":                  nil,
	"internal/collect":                   nil,
	"internal/authz":                     nil,
	"internal/statefile":                 {"tiers"},
	"internal/statsd":                    nil,
	"internal/statsmap":                  nil,
	"internal/tracing":                   nil,
	"internal/redisbackend": {"descriptors", "internal/collect", "internal/copystore/rediscopy", "internal/escrow", "internal/tlsconfig",
		"internal/periodic", "internal/redisconn", "internal/sharestore/redisshare", "internal/store/memstore", "internal/store/redisstore", "internal/store/resilient"},
	"internal/redisconn":         nil,
	"internal/redisfunc":         nil,
	"internal/redistest":         nil,
	"internal/servertest":        {"descriptors", "internal/copystore/memcopy", "internal/engine", "internal/holds", "internal/store/memstore", "server", "service/charon", "service/rls", "tiers"},
	"internal/store":             {"tiers"},
	"internal/store/memstore":    {"internal/lru", "internal/periodic", "internal/statefile", "internal/store", "tiers"},
	"internal/store/redisstore":  {"internal/redisfunc", "internal/store", "tiers"},
	"internal/store/resilient":   {"internal/collect", "internal/lru", "internal/store", "internal/store/memstore", "tiers"},
	"internal/store/storetest":   {"internal/store", "tiers", "tiers/tierstest"},
	"internal/tlsconfig":         nil,
	"internal/tlsconfig/tlstest": nil,
	"internal/xdsconfig":         {"config", "internal/tlsconfig"},
	"server": {"config", "copylog", "descriptors", "internal/authz", "internal/copystore", "internal/engine", "internal/holds",
		"internal/tlsconfig", "internal/sim", "internal/rlqs"},
	"service/charon":  {"api/charon/v1", "copylog", "descriptors", "internal/authz", "internal/engine", "internal/holds", "server", "tiers"},
	"service/rlqs":    {"descriptors", "internal/authz", "internal/rlqs", "server"},
	"service/rls":     {"descriptors", "internal/authz", "internal/decisionlog", "internal/engine", "internal/offenders", "server", "tiers"},
	"tiers":           nil,
	"tiers/tierstest": {"tiers"},
}

// floors are the floors of the house, bottom up (docs/architecture.md): a
// package may import only packages on floors below its own, so that no
// arrow of the import graph goes up, and none sideways: the packages of one
// floor never import each other (the pipelines do not, the services do
// not). Every package of the table is on one floor.
var floors = []struct {
	name string
	pkgs []string
}{
	{"ground: the pure cores, the generated API, and leaves that import nothing of the module", []string{
		"tiers", "copylog", "fairshare", "api/charon/v1", "internal/authz", "internal/collect", "internal/decisionlog", "internal/deptest",
		"internal/gctune", "internal/lru", "internal/lyftenv", "internal/periodic", "internal/redisconn", "internal/redisfunc", "internal/redistest",
		"internal/rlqssim", "internal/sim/gen", "internal/statsd", "internal/statsmap", "internal/tlsconfig", "internal/tlsconfig/tlstest", "internal/tracing"}},
	{"the request vocabulary, the store contracts, the Go client", []string{
		"descriptors", "internal/store", "internal/copystore", "internal/sharestore", "internal/statefile", "internal/memlimit",
		"client", "internal/loadgen", "tiers/tierstest"}},
	{"the configuration, the stores and the pipelines", []string{
		"config", "internal/store/memstore", "internal/store/redisstore", "internal/copystore/memcopy", "internal/copystore/rediscopy",
		"internal/sharestore/redisshare", "internal/escrow", "internal/engine", "internal/holds", "internal/rlqs", "internal/offenders",
		"internal/store/storetest", "internal/copystore/copystoretest", "internal/sharestore/sharestoretest"}},
	{"what builds on them: the resilient store, the canary, replay, suggest, the simulators, the xDS client, the client verbs", []string{
		"internal/store/resilient", "internal/canary", "internal/replay", "internal/suggest", "internal/sim", "internal/escrowsim", "internal/xdsconfig", "internal/clientcmd",
		"internal/escrow/pooltest"}},
	{"the Redis backend, the server's lifecycle, the offline verbs", []string{"internal/redisbackend", "server", "internal/offlinecmd"}},
	{"the services, each registered on the server it is handed", services},
	{"main, and the in-process server of tests", []string{"cmd/charon", "internal/servertest"}},
}

// services are the packages that serve a gRPC service on a server; only
// cmd/charon and test support (servertest) import them.
var services = []string{"service/charon", "service/rlqs", "service/rls"}

// floorOf returns the floor of a package of the module, -1 when it is on
// none.
func floorOf(rel string) int {
	for i, f := range floors {
		if slices.Contains(f.pkgs, rel) {
			return i
		}
	}
	return -1
}

// pure are the packages that import only the standard library, and of it
// nothing that reads a clock, draws random numbers, does I/O or shares
// memory; no goroutine starts in them and time is a parameter.
var pure = []string{"tiers", "copylog", "fairshare"}

// moduleOnly are the packages that depend on the standard library and the
// module alone.
var moduleOnly = []string{"descriptors"}

// impure are the standard packages a pure package must not import.
var impure = []string{"crypto/rand", "io", "log", "log/slog", "math/rand", "math/rand/v2", "net", "os",
	"sync", "sync/atomic", "unsafe"}

// clockCalls are the calls of package time that read the clock or wait.
var clockCalls = []string{"After", "AfterFunc", "NewTicker", "NewTimer", "Now", "Since", "Sleep", "Tick", "Until"}

// connOwner is the one package that opens Redis connections and reads Redis
// URLs; the stores take the client it opens. Test support (redistest) opens
// plain clients of the servers it starts.
const connOwner = "internal/redisconn"

var connExempt = []string{connOwner, "internal/redistest"}

// redisConnCalls are go-redis' functions that make a client or read a URL.
var redisConnCalls = []string{"NewClient", "NewUniversalClient", "NewClusterClient", "NewFailoverClient",
	"NewFailoverClusterClient", "NewRing", "NewSentinelClient", "ParseURL", "ParseClusterURL", "ParseFailoverURL"}

// deny lists, for packages of the module, import paths (and their
// subpackages) that must not be among their dependencies, direct or not.
var deny = []struct {
	pkgs   []string // "...": every package of the module but except
	except []string
	paths  []string
	why    string
}{
	{
		pkgs: []string{"internal/engine"},
		paths: []string{module + "/internal/store/memstore", module + "/internal/store/redisstore",
			module + "/internal/store/resilient", module + "/internal/copystore/memcopy",
			module + "/internal/copystore/rediscopy", "github.com/redis/go-redis", "github.com/prometheus"},
		why: "the engine decides through the store contracts; the caller picks the stores and exports their metrics",
	},
	{
		pkgs: []string{"internal/holds"},
		paths: []string{module + "/internal/copystore/memcopy", module + "/internal/copystore/rediscopy",
			"github.com/redis/go-redis", "github.com/prometheus"},
		why: "the copy operations run through the copy store contract; the caller picks the store and exports its metrics",
	},
	{
		pkgs:  []string{"internal/holds"},
		paths: []string{module + "/internal/engine"},
		why: "the copy operations are a pipeline beside the RLS one, not on it: a resource is checked, and a bad field named, " +
			"with package descriptors' ValidateResource, InputError, FieldError and ErrUnknownResource",
	},
	{
		pkgs: []string{"..."},
		// Prometheus' exposition model is protobuf: the packages that
		// export a store's (or the canary's) collector, or gather series (statsmap), depend
		// on it, and on no gRPC. The
		// OTLP exporter of internal/tracing speaks gRPC. The offline
		// verbs share the client verbs' flag set and exit statuses
		// (internal/clientcmd), and so depend on what those call with.
		except: append([]string{"api/charon/v1", "client", "cmd/charon", "internal/clientcmd", "internal/offlinecmd", "internal/servertest", "server", "internal/loadgen", "internal/rlqssim", "internal/collect",
			"internal/canary", "internal/store/resilient", "internal/escrow", "internal/escrow/pooltest", "internal/escrowsim", "internal/copystore/memcopy", "internal/redisbackend", "internal/tracing", "internal/statsmap", "internal/xdsconfig"}, services...),
		paths: []string{"google.golang.org/grpc", "google.golang.org/protobuf", "github.com/envoyproxy/go-control-plane",
			module + "/api/charon/v1"},
		why: "only server, the services and client (and main, the generated API and the xDS client) touch gRPC and protos",
	},
	{
		pkgs:  services,
		paths: []string{module + "/service/"},
		why:   "services never import each other: what two share (the engine, the candidate) is handed to each by cmd/charon",
	},
	{
		pkgs:   []string{"..."},
		except: append([]string{"cmd/charon", "internal/servertest"}, services...),
		paths:  []string{module + "/service/"},
		why:    "only cmd/charon wires the services (and servertest serves them to tests); a library does not import a service",
	},
	{
		pkgs: []string{"..."},
		except: []string{"internal/copystore/copystoretest", "internal/store/storetest", "internal/sharestore/sharestoretest", "internal/redistest",
			"tiers/tierstest", "internal/tlsconfig/tlstest", "internal/servertest", "internal/escrow/pooltest"},
		paths: []string{"testing", module + "/internal/copystore/copystoretest", module + "/internal/sharestore/sharestoretest", module + "/internal/store/storetest",
			module + "/internal/escrow/pooltest",
			module + "/internal/redistest", module + "/tiers/tierstest", module + "/internal/tlsconfig/tlstest", module + "/internal/servertest"},
		why: "test support is for tests",
	},
}

// pkg is what the test reads of `go list -json`.
type pkg struct {
	ImportPath string
	Dir        string
	Standard   bool
	Imports    []string
	Deps       []string
	GoFiles    []string
}

func TestDeps(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go is not on PATH")
	}
	cmd := exec.Command(goBin, "list", "-deps", "-json", module+"/...")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	pkgs, err := decode(strings.NewReader(string(out)))
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range violations(pkgs) {
		t.Error(v)
	}
	for _, p := range pkgs {
		rel, ok := relative(p.ImportPath)
		if ok && slices.Contains(pure, rel) {
			for _, v := range impureCode(p) {
				t.Error(v)
			}
		}
		if ok && !slices.Contains(connExempt, rel) {
			for _, v := range redisConnCode(p) {
				t.Error(v)
			}
		}
	}
}

// TestRulesCatch: the table notices what it is there for.
func TestRulesCatch(t *testing.T) {
	// mod is a package of the module importing imports and nothing else.
	mod := func(rel string, imports ...string) pkg {
		return pkg{ImportPath: module + "/" + rel, Imports: imports, Deps: imports}
	}
	for _, tt := range []struct {
		name string
		pkgs []pkg
		want string
	}{
		{"engine imports memstore", []pkg{mod("internal/engine", module+"/internal/store/memstore")},
			"internal/engine imports internal/store/memstore"},
		{"engine reaches a store through another package", []pkg{{ImportPath: module + "/internal/engine",
			Deps: []string{module + "/internal/store/redisstore"}}}, "internal/engine depends on " + module + "/internal/store/redisstore"},
		{"engine imports gRPC", []pkg{mod("internal/engine", "google.golang.org/grpc")}, "depends on google.golang.org/grpc"},
		{"holds reaches the Redis copy store", []pkg{{ImportPath: module + "/internal/holds",
			Deps: []string{module + "/internal/copystore/rediscopy"}}}, "internal/holds depends on " + module + "/internal/copystore/rediscopy"},
		{"holds imports the engine", []pkg{mod("internal/holds", module+"/internal/engine")},
			"internal/holds imports internal/engine"},
		{"holds reaches the engine through another package", []pkg{{ImportPath: module + "/internal/holds",
			Deps: []string{module + "/internal/engine"}}}, "internal/holds depends on " + module + "/internal/engine: the copy operations"},
		{"tiers imports a module", []pkg{mod("tiers", "github.com/google/go-cmp/cmp")}, "tiers depends on github.com/google/go-cmp/cmp, outside the standard library"},
		{"tiers imports os", []pkg{mod("tiers", "os")}, "tiers imports os"},
		{"descriptors imports yaml", []pkg{mod("descriptors", "gopkg.in/yaml.v3")}, "descriptors depends on gopkg.in/yaml.v3, outside the standard library and the module"},
		{"config imports protos", []pkg{mod("config", module+"/api/charon/v1")}, "config imports api/charon/v1"},
		{"a package not in the table", []pkg{mod("internal/newthing")}, "internal/newthing is not in the table"},
		{"server imports storetest", []pkg{mod("server", module+"/internal/store/storetest")}, "server depends on " + module + "/internal/store/storetest"},
		{"a permission nobody uses", []pkg{mod("internal/statefile")}, "internal/statefile may import tiers but does not"},
		{"a service imports another", []pkg{{ImportPath: module + "/service/rls", Deps: []string{module + "/service/charon"}}},
			"service/rls depends on " + module + "/service/charon: services never import each other"},
		{"a package imports a service", []pkg{{ImportPath: module + "/internal/clientcmd", Deps: []string{module + "/service/rls"}}},
			"internal/clientcmd depends on " + module + "/service/rls: only cmd/charon wires the services"},
		{"the server imports a service", []pkg{{ImportPath: module + "/server", Deps: []string{module + "/service/rlqs"}}},
			"server depends on " + module + "/service/rlqs: only cmd/charon wires the services"},
	} {
		got := strings.Join(violations(tt.pkgs), "\n")
		if !strings.Contains(got, tt.want) {
			t.Errorf("%s: violations\n%s\nwant one containing %q", tt.name, got, tt.want)
		}
	}
	// The floors: an arrow up, or sideways, is refused in the table itself.
	for _, tt := range []struct {
		name, pkg, imp, want string
	}{
		{"the engine may import the server", "internal/engine", "server", "internal/engine (floor 2) may import server (floor 4): an arrow up"},
		{"a pipeline may import another", "internal/holds", "internal/engine", "internal/holds may import internal/engine, on its own floor (2)"},
		{"a service may import another", "service/rls", "service/charon", "service/rls may import service/charon, on its own floor (5)"},
	} {
		old := imports[tt.pkg]
		imports[tt.pkg] = append(slices.Clone(old), tt.imp)
		got := strings.Join(violations([]pkg{mod(tt.pkg)}), "\n")
		imports[tt.pkg] = old
		if !strings.Contains(got, tt.want) {
			t.Errorf("%s: violations\n%s\nwant one containing %q", tt.name, got, tt.want)
		}
	}
	// A package in the table, but on no floor.
	imports["internal/newthing"] = nil
	got := strings.Join(violations([]pkg{mod("internal/newthing")}), "\n")
	delete(imports, "internal/newthing")
	if !strings.Contains(got, "internal/newthing is on no floor") {
		t.Errorf("a package on no floor: violations\n%s", got)
	}
}

func decode(r io.Reader) ([]pkg, error) {
	var pkgs []pkg
	dec := json.NewDecoder(r)
	for {
		var p pkg
		err := dec.Decode(&p)
		if errors.Is(err, io.EOF) {
			return pkgs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("go list output: %w", err)
		}
		pkgs = append(pkgs, p)
	}
}

// relative returns path relative to the module, and whether it is in it.
func relative(path string) (string, bool) {
	if path == module {
		return ".", true
	}
	return strings.CutPrefix(path, module+"/")
}

func isStd(path string) bool { return !strings.Contains(strings.Split(path, "/")[0], ".") }

// violations checks the packages of the module among pkgs against the
// table and the rules.
func violations(pkgs []pkg) []string {
	var out []string
	seen := map[string]bool{}
	for _, p := range pkgs {
		rel, ok := relative(p.ImportPath)
		if !ok {
			continue
		}
		seen[rel] = true
		allowed, listed := imports[rel]
		if !listed {
			out = append(out, rel+" is not in the table of deptest_test.go: add it with the packages of the module it may import")
			continue
		}
		for _, imp := range p.Imports {
			if r, ok := relative(imp); ok && !slices.Contains(allowed, r) {
				out = append(out, fmt.Sprintf("%s imports %s, which the table does not allow", rel, r))
			}
		}
		if f := floorOf(rel); f < 0 {
			out = append(out, rel+" is on no floor of deptest_test.go: add it to the floor of what it provides")
		} else {
			for _, a := range allowed {
				switch g := floorOf(a); {
				case g > f:
					out = append(out, fmt.Sprintf("%s (floor %d) may import %s (floor %d): an arrow up", rel, f, a, g))
				case g == f:
					out = append(out, fmt.Sprintf("%s may import %s, on its own floor (%d): the packages of a floor do not import each other", rel, a, f))
				}
			}
		}
		for _, a := range allowed {
			if !slices.Contains(p.Imports, module+"/"+a) {
				out = append(out, fmt.Sprintf("%s may import %s but does not: remove it from the table (a permission nobody uses hides the next one)", rel, a))
			}
		}
		for _, d := range p.Deps {
			_, inModule := relative(d)
			switch {
			case slices.Contains(pure, rel) && !isStd(d):
				out = append(out, fmt.Sprintf("%s depends on %s, outside the standard library", rel, d))
			case slices.Contains(moduleOnly, rel) && !isStd(d) && !inModule:
				out = append(out, fmt.Sprintf("%s depends on %s, outside the standard library and the module", rel, d))
			}
		}
		if slices.Contains(pure, rel) {
			for _, imp := range p.Imports {
				if slices.Contains(impure, imp) {
					out = append(out, fmt.Sprintf("%s imports %s: the package must stay pure", rel, imp))
				}
			}
		}
		for _, r := range deny {
			applies := slices.Contains(r.pkgs, rel) || (slices.Contains(r.pkgs, "...") && !slices.Contains(r.except, rel))
			if !applies {
				continue
			}
			for _, d := range p.Deps {
				for _, bad := range r.paths {
					if d == bad || strings.HasPrefix(d, strings.TrimSuffix(bad, "/")+"/") {
						out = append(out, fmt.Sprintf("%s depends on %s: %s", rel, d, r.why))
					}
				}
			}
		}
	}
	if len(seen) > 1 {
		for rel := range imports {
			if !seen[rel] {
				out = append(out, rel+" is in the table but not in the module: remove its line")
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// redisConnCode finds, in p's Go files (tests aside), calls of go-redis that
// make a client or read a Redis URL: connOwner's alone.
func redisConnCode(p pkg) []string {
	var out []string
	fset := token.NewFileSet()
	for _, name := range p.GoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, 0)
		if err != nil {
			out = append(out, err.Error())
			continue
		}
		redisName := ""
		for _, imp := range f.Imports {
			if imp.Path.Value == `"github.com/redis/go-redis/v9"` {
				redisName = "redis"
				if imp.Name != nil {
					redisName = imp.Name.Name
				}
			}
		}
		if redisName == "" {
			continue
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if x, ok := n.(*ast.SelectorExpr); ok {
				if id, ok := x.X.(*ast.Ident); ok && id.Name == redisName && slices.Contains(redisConnCalls, x.Sel.Name) {
					out = append(out, fmt.Sprintf("%v: redis.%s outside %s, which owns Redis connections: take its client", fset.Position(x.Pos()), x.Sel.Name, connOwner))
				}
			}
			return true
		})
	}
	return out
}

// TestRedisConnRuleCatches: a package other than connOwner that opens a
// go-redis client is reported.
func TestRedisConnRuleCatches(t *testing.T) {
	dir := t.TempDir()
	src := "package x\n\nimport r \"github.com/redis/go-redis/v9\"\n\nvar c = r.NewClient(&r.Options{})\n"
	if err := os.WriteFile(filepath.Join(dir, "x.go"), []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	got := strings.Join(redisConnCode(pkg{ImportPath: module + "/internal/x", Dir: dir, GoFiles: []string{"x.go"}}), "\n")
	if !strings.Contains(got, "redis.NewClient outside "+connOwner) {
		t.Errorf("violations %q, want redis.NewClient reported", got)
	}
}

// impureCode finds, in p's Go files (tests aside), go statements and calls of
// package time that read the clock or wait.
func impureCode(p pkg) []string {
	var out []string
	fset := token.NewFileSet()
	for _, name := range p.GoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, 0)
		if err != nil {
			out = append(out, err.Error())
			continue
		}
		timeName := ""
		for _, imp := range f.Imports {
			if imp.Path.Value == `"time"` {
				timeName = "time"
				if imp.Name != nil {
					timeName = imp.Name.Name
				}
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.GoStmt:
				out = append(out, fmt.Sprintf("%v: go statement in a pure package", fset.Position(x.Pos())))
			case *ast.SelectorExpr:
				if id, ok := x.X.(*ast.Ident); ok && timeName != "" && id.Name == timeName && slices.Contains(clockCalls, x.Sel.Name) {
					out = append(out, fmt.Sprintf("%v: time.%s in a pure package: time is a parameter", fset.Position(x.Pos()), x.Sel.Name))
				}
			}
			return true
		})
	}
	return out
}

// TestFloorsAreTheTable: the floors name the table's packages, each on
// exactly one floor, so that neither table outlives a package.
func TestFloorsAreTheTable(t *testing.T) {
	seen := map[string]bool{}
	for _, f := range floors {
		for _, p := range f.pkgs {
			if seen[p] {
				t.Errorf("%s is on two floors", p)
			}
			seen[p] = true
			if _, ok := imports[p]; !ok {
				t.Errorf("%s is on a floor (%s) but not in the table", p, f.name)
			}
		}
	}
	for p := range imports {
		if !seen[p] {
			t.Errorf("%s is in the table but on no floor", p)
		}
	}
}
