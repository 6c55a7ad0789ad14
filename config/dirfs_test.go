package config

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"testing/fstest"

	"github.com/google/go-cmp/cmp"
)

// TestDirFSHidesDotNames: every way into a name starting with "." fails as a
// missing file, and listings leave such names out.
func TestDirFSHidesDotNames(t *testing.T) {
	dir := t.TempDir()
	for name, text := range map[string]string{
		"a.yaml":              "domain: a\n",
		".hidden.yaml":        "domain: h\n",
		"..2030_01_01/b.yaml": "domain: b\n",
		"sub/c.yaml":          "domain: c\n",
		"sub/.secret/d.yaml":  "domain: d\n",
	} {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fsys := DirFS(dir)
	var seen []string
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		seen = append(seen, p)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{".", "a.yaml", "sub", "sub/c.yaml"}, seen); diff != "" {
		t.Errorf("walk (-want +got):\n%s", diff)
	}
	for _, name := range []string{".hidden.yaml", "..2030_01_01/b.yaml", "sub/.secret", "sub/.secret/d.yaml"} {
		if _, err := fs.ReadFile(fsys, name); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("ReadFile(%q) = %v, want fs.ErrNotExist", name, err)
		}
		if _, err := fs.Stat(fsys, name); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("Stat(%q) = %v, want fs.ErrNotExist", name, err)
		}
		if _, err := fsys.Open(name); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("Open(%q) = %v, want fs.ErrNotExist", name, err)
		}
	}
	if b, err := fs.ReadFile(fsys, "sub/c.yaml"); err != nil || string(b) != "domain: c\n" {
		t.Errorf("ReadFile(sub/c.yaml) = %q, %v", b, err)
	}
	// A directory read in batches skips hidden entries without ending early.
	f, err := fsys.Open(".")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var names []string
	for {
		ents, err := f.(fs.ReadDirFile).ReadDir(1)
		for _, e := range ents {
			names = append(names, e.Name())
		}
		if err != nil {
			break
		}
	}
	if diff := cmp.Diff([]string{"a.yaml", "sub"}, names); diff != "" {
		t.Errorf("ReadDir(1) batches (-want +got):\n%s", diff)
	}
}

func TestFilesIsAnFS(t *testing.T) {
	files := Files{"a.yaml": []byte("domain: a\n"), "b.yaml": []byte("domain: b\n")}
	if err := fstest.TestFS(files, "a.yaml", "b.yaml"); err != nil {
		t.Fatal(err)
	}
	cfg, _, err := Load(files, Options{})
	if err != nil || len(cfg.Tree.Domains()) != 2 {
		t.Fatalf("Load(Files): %v, %v", cfg, err)
	}
}
