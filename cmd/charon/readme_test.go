package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// runnableMarker is the line that, right before a ```sh fence in the README
// or a page of docs/, says the block runs as written against `make run`
// (examples/config served on localhost:8081, :8080 and 127.0.0.1:6070) with
// charon on the PATH, and TestReadmeRunnable runs it.
const runnableMarker = "<!-- runnable -->"

// block is a runnable shell block and where it starts.
type block struct {
	where string
	text  string
}

// runnableBlocks returns the runnable blocks of the Markdown file path.
func runnableBlocks(t *testing.T, path string) []block {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []block
	var cur *block
	marked := false
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur != nil && strings.TrimSpace(line) == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.text += line + "\n"
		case marked && strings.TrimSpace(line) == "```sh":
			cur = &block{where: path + ":" + strconv.Itoa(n)}
		case marked && strings.TrimSpace(line) != "":
			t.Errorf("%s:%d: %s is not followed by a ```sh block", path, n-1, runnableMarker)
		}
		if cur == nil {
			marked = strings.TrimSpace(line) == runnableMarker
		} else {
			marked = false
		}
	}
	if cur != nil {
		t.Errorf("%s: unterminated block at %s", path, cur.where)
	}
	return out
}

// TestReadmeRunnable runs every runnable block of README.md and docs/*.md,
// in order, as a new user would after `make build` and
// `export PATH=$PWD/bin:$PATH`: from the top of the checkout, with the
// built charon first on the PATH, against `charon serve --config
// examples/config` on free ports (the blocks' ports rewritten to them).
// Each block runs under bash -eu -o pipefail and must exit 0.
func TestReadmeRunnable(t *testing.T) {
	bin := buildCharon(t)
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	var blocks []block
	docs, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	for _, md := range append([]string{filepath.Join(root, "README.md")}, docs...) {
		blocks = append(blocks, runnableBlocks(t, md)...)
	}
	if len(blocks) < 3 {
		t.Fatalf("%d runnable blocks, want the README's at least", len(blocks))
	}
	p := startServe(t, bin, "--config", filepath.Join(root, "examples", "config"))
	ports := strings.NewReplacer("localhost:8081", p.grpcAddr, "localhost:8080", p.httpAddr,
		"127.0.0.1:6070", p.debugAddr, "localhost:6070", p.debugAddr)
	env := append(os.Environ(), "PATH="+filepath.Dir(bin)+string(os.PathListSeparator)+os.Getenv("PATH"))
	for _, b := range blocks {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cmd := exec.CommandContext(ctx, "bash", "-eu", "-o", "pipefail", "-c", ports.Replace(b.text))
		cmd.Dir, cmd.Env = root, env
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			t.Errorf("%s: %v\n%s\noutput:\n%s", b.where, err, b.text, out)
		}
	}
}
