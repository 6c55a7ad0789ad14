package statefile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Write writes recs to path atomically: to a temporary file in path's
// directory, synced, then renamed over path (and the directory synced), so
// that path always holds a whole snapshot, the old or the new.
func Write(path string, writtenUS int64, recs []Record) error {
	b := Append(nil, writtenUS, recs)
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("state file %s: %w", path, err)
	}
	tmp := f.Name()
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("state file %s: %w", path, err)
	}
	// The rename is durable once the directory is synced; a directory that
	// cannot be opened for it (some platforms) still holds the new file.
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// Writable checks that a snapshot can be written at path: its directory
// exists and takes a new file (a temporary one, removed at once), and path
// itself, when it exists, is a regular file. The error names the path and
// what to do.
func Writable(path string) error {
	dir := filepath.Dir(path)
	fi, err := os.Stat(dir)
	switch {
	case err != nil && os.IsNotExist(err):
		return fmt.Errorf("state file %s: its directory %s does not exist: create it (or mount a volume there), or choose another --state-file", path, dir)
	case err != nil:
		return fmt.Errorf("state file %s: %w", path, err)
	case !fi.IsDir():
		return fmt.Errorf("state file %s: %s is not a directory", path, dir)
	}
	if fi, err := os.Stat(path); err == nil && !fi.Mode().IsRegular() {
		return fmt.Errorf("state file %s: not a regular file: choose a file path for --state-file", path)
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("state file %s: cannot write in %s (%w): make it writable by this process's user, or choose another --state-file", path, dir, errors.Unwrap(err))
	}
	f.Close()
	os.Remove(f.Name())
	return nil
}

// Read returns the records of the state file at path (see Decode); an
// error names the file.
func Read(path string) (recs []Record, writtenUS int64, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, 0, fmt.Errorf("state file %s: %w", path, err)
	}
	recs, writtenUS, err = Decode(b)
	if err != nil {
		return nil, 0, fmt.Errorf("state file %s: %w", path, err)
	}
	return recs, writtenUS, nil
}
