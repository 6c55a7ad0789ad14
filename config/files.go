package config

import (
	"io"
	"io/fs"
	"slices"
	"time"
)

// Files is a configuration that does not come from a directory (a response
// of an xDS server, a text pasted into the simulator) as a directory Load
// can read: file names, with no "/", and their contents. It implements
// fs.FS, fs.StatFS, fs.ReadDirFS and fs.ReadFileFS (testing/fstest.TestFS
// passes). Safe for concurrent reads.
type Files map[string][]byte

func (m Files) Open(name string) (fs.File, error) {
	info, err := m.Stat(name)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	f := &file{info: info.(fileInfo), data: m[name]}
	if f.info.dir {
		f.ents, _ = m.ReadDir(".")
	}
	return f, nil
}

func (m Files) Stat(name string) (fs.FileInfo, error) {
	if name == "." {
		return fileInfo{name: ".", dir: true}, nil
	}
	if d, ok := m[name]; ok {
		return fileInfo{name: name, size: int64(len(d))}, nil
	}
	return nil, &fs.PathError{Op: "stat", Path: name, Err: fs.ErrNotExist}
}

func (m Files) ReadDir(name string) ([]fs.DirEntry, error) {
	if name != "." {
		return nil, &fs.PathError{Op: "readdir", Path: name, Err: fs.ErrNotExist}
	}
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	slices.Sort(names)
	out := make([]fs.DirEntry, len(names))
	for i, n := range names {
		out[i] = fs.FileInfoToDirEntry(fileInfo{name: n, size: int64(len(m[n]))})
	}
	return out, nil
}

func (m Files) ReadFile(name string) ([]byte, error) {
	if d, ok := m[name]; ok {
		return slices.Clone(d), nil
	}
	return nil, &fs.PathError{Op: "read", Path: name, Err: fs.ErrNotExist}
}

// fileInfo describes an entry of Files.
type fileInfo struct {
	name string
	size int64
	dir  bool
}

func (i fileInfo) Name() string { return i.name }
func (i fileInfo) Size() int64  { return i.size }
func (i fileInfo) Mode() fs.FileMode {
	if i.dir {
		return fs.ModeDir | 0o555
	}
	return 0o444
}
func (i fileInfo) ModTime() time.Time { return time.Time{} }
func (i fileInfo) IsDir() bool        { return i.dir }
func (i fileInfo) Sys() any           { return nil }

// file is an open entry of Files.
type file struct {
	info fileInfo
	data []byte
	off  int
	// ents are the directory's entries not yet read (the root only).
	ents []fs.DirEntry
}

// ReadDir reads the root directory's entries.
func (f *file) ReadDir(n int) ([]fs.DirEntry, error) {
	if !f.info.dir {
		return nil, &fs.PathError{Op: "readdir", Path: f.info.name, Err: fs.ErrInvalid}
	}
	if n <= 0 {
		out := f.ents
		f.ents = nil
		return out, nil
	}
	if len(f.ents) == 0 {
		return nil, io.EOF
	}
	n = min(n, len(f.ents))
	out := f.ents[:n:n]
	f.ents = f.ents[n:]
	return out, nil
}

func (f *file) Stat() (fs.FileInfo, error) { return f.info, nil }
func (f *file) Close() error               { return nil }
func (f *file) Read(p []byte) (int, error) {
	if f.info.dir {
		return 0, &fs.PathError{Op: "read", Path: f.info.name, Err: fs.ErrInvalid}
	}
	if f.off >= len(f.data) {
		return 0, io.EOF
	}
	n := copy(p, f.data[f.off:])
	f.off += n
	return n, nil
}
