package config

import (
	"io/fs"
	"os"
	"strings"
)

// DirFS is the view of a configuration directory that is loaded: os.DirFS
// with every name starting with "." hidden (a Kubernetes ConfigMap keeps its
// real files in "..<timestamp>" directories, reached through its top-level
// symlinks). The server's reloader and `charon config check` both load
// through it, so the check sees exactly what serve would load, whatever the
// loader.
func DirFS(dir string) fs.FS { return visibleFS{os.DirFS(dir)} }

// visibleFS hides every name starting with ".".
type visibleFS struct{ fsys fs.FS }

func hidden(name string) bool {
	for _, part := range strings.Split(name, "/") {
		if strings.HasPrefix(part, ".") && part != "." {
			return true
		}
	}
	return false
}

func (v visibleFS) Open(name string) (fs.File, error) {
	if hidden(name) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	f, err := v.fsys.Open(name)
	if err != nil {
		return nil, err
	}
	if d, ok := f.(fs.ReadDirFile); ok {
		return visibleDir{d}, nil
	}
	return f, nil
}

func (v visibleFS) ReadDir(name string) ([]fs.DirEntry, error) {
	if hidden(name) {
		return nil, &fs.PathError{Op: "readdir", Path: name, Err: fs.ErrNotExist}
	}
	ents, err := fs.ReadDir(v.fsys, name)
	return visible(ents), err
}

func (v visibleFS) ReadFile(name string) ([]byte, error) {
	if hidden(name) {
		return nil, &fs.PathError{Op: "readfile", Path: name, Err: fs.ErrNotExist}
	}
	return fs.ReadFile(v.fsys, name)
}

func (v visibleFS) Stat(name string) (fs.FileInfo, error) {
	if hidden(name) {
		return nil, &fs.PathError{Op: "stat", Path: name, Err: fs.ErrNotExist}
	}
	return fs.Stat(v.fsys, name)
}

type visibleDir struct{ fs.ReadDirFile }

func (d visibleDir) ReadDir(n int) ([]fs.DirEntry, error) {
	for {
		ents, err := d.ReadDirFile.ReadDir(n)
		ents = visible(ents)
		// With n > 0, an empty batch without error would read as "no more
		// entries yet"; read on until something visible or an error.
		if n <= 0 || len(ents) > 0 || err != nil {
			return ents, err
		}
	}
}

func visible(ents []fs.DirEntry) []fs.DirEntry {
	out := ents[:0]
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".") {
			out = append(out, e)
		}
	}
	return out
}
