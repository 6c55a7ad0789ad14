package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
)

// serveFlags are the flags `charon serve -h` lists, from the binary.
var serveFlags []string

func charonServeFlags(t *testing.T) []string {
	t.Helper()
	if serveFlags != nil {
		return serveFlags
	}
	out, _ := exec.Command(charonBin(t), "serve", "-h").CombinedOutput()
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`).FindAllStringSubmatch(string(out), -1) {
		serveFlags = append(serveFlags, m[1])
	}
	if len(serveFlags) < 10 {
		t.Fatalf("charon serve -h lists %d flags:\n%s", len(serveFlags), out)
	}
	return serveFlags
}

// binDir holds the binary charonBin builds; TestMain removes it.
var binPath, binDir string

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// charonBin builds cmd/charon once for the tests of this package.
func charonBin(t *testing.T) string {
	t.Helper()
	if binPath != "" {
		return binPath
	}
	dir, err := os.MkdirTemp("", "charon-deploy-test")
	if err != nil {
		t.Fatal(err)
	}
	binDir = dir
	// Pods run it as their containers' users (pod_linux_test.go).
	os.Chmod(dir, 0o755)
	bin := filepath.Join(dir, "charon")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/charon")
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	binPath = bin
	return bin
}
