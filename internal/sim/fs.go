package sim

import (
	"io/fs"
	"time"
)

// oneFile is a directory holding one file, what config.Load reads a pasted
// configuration from.
type oneFile struct {
	name string
	data []byte
}

type info struct {
	name string
	size int64
	dir  bool
}

func (i info) Name() string { return i.name }
func (i info) Size() int64  { return i.size }
func (i info) Mode() fs.FileMode {
	if i.dir {
		return fs.ModeDir | 0o555
	}
	return 0o444
}
func (i info) ModTime() time.Time { return time.Time{} }
func (i info) IsDir() bool        { return i.dir }
func (i info) Sys() any           { return nil }

func (o oneFile) Open(name string) (fs.File, error) {
	return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
}

func (o oneFile) Stat(name string) (fs.FileInfo, error) {
	switch name {
	case ".":
		return info{name: ".", dir: true}, nil
	case o.name:
		return info{name: o.name, size: int64(len(o.data))}, nil
	}
	return nil, &fs.PathError{Op: "stat", Path: name, Err: fs.ErrNotExist}
}

func (o oneFile) ReadDir(name string) ([]fs.DirEntry, error) {
	if name != "." {
		return nil, &fs.PathError{Op: "readdir", Path: name, Err: fs.ErrNotExist}
	}
	return []fs.DirEntry{fs.FileInfoToDirEntry(info{name: o.name, size: int64(len(o.data))})}, nil
}

func (o oneFile) ReadFile(name string) ([]byte, error) {
	if name != o.name {
		return nil, &fs.PathError{Op: "read", Path: name, Err: fs.ErrNotExist}
	}
	return o.data, nil
}
