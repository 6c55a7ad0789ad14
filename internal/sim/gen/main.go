// Command gen builds the simulator's engine: it compiles ../wasm (package
// tiers and the config loader) to web/charon.wasm and copies the Go
// toolchain's wasm_exec.js beside it, so the page and the module match.
// Run by `go generate ./internal/sim` (make sim-wasm) from the package
// directory; both files are build outputs, not checked in.
package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}

func run() error {
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", filepath.Join("web", "charon.wasm"), "./wasm")
	cmd.Env = append(os.Environ(), "GOOS=js", "GOARCH=wasm", "CGO_ENABLED=0")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("building the engine: %w", err)
	}
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		return fmt.Errorf("go env GOROOT: %w", err)
	}
	root := string(out[:len(out)-1])
	if root == "" {
		root = runtime.GOROOT()
	}
	js, err := os.ReadFile(filepath.Join(root, "lib", "wasm", "wasm_exec.js"))
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join("web", "wasm_exec.js"), js, 0o644)
}
