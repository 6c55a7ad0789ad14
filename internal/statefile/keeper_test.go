package statefile

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// fakeSource holds records as they are: Restore keeps those not forgotten.
type fakeSource struct {
	mu   sync.Mutex
	recs []Record
}

func (f *fakeSource) Snapshot(time.Time) []Record {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Record(nil), f.recs...)
}

func (f *fakeSource) Restore(now time.Time, recs []Record) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range recs {
		if r.Forget > now.UnixMicro() {
			f.recs = append(f.recs, r)
		}
	}
	return len(f.recs)
}

var t0 = time.UnixMicro(1_000)

func TestKeeperRestoresAndSaves(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state")
	src := &fakeSource{recs: sample}
	k, err := Open(src, Options{Path: path, Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatalf("Open without a file (a first start): %v", err)
	}
	if err := k.Close(); err != nil {
		t.Fatal(err)
	}
	if err := k.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if k.Saved() != 1 {
		t.Errorf("Close wrote %d snapshots, want 1", k.Saved())
	}
	restored := &fakeSource{}
	k, err = Open(restored, Options{Path: path, Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	// sample[2] is forgotten at 12 µs, before t0.
	if diff := cmp.Diff([]Record{sample[0], sample[1], sample[3]}, restored.Snapshot(t0)); diff != "" {
		t.Errorf("restored (-want +got):\n%s", diff)
	}
}

// TestKeeperSavesEveryInterval waits, with a deadline, for two periodic
// snapshots.
func TestKeeperSavesEveryInterval(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state")
	k, err := Open(&fakeSource{recs: sample}, Options{Path: path, Interval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	deadline := time.Now().Add(20 * time.Second)
	for k.Saved() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d snapshots in 20s", k.Saved())
		}
		time.Sleep(time.Millisecond)
	}
	if _, _, err := Read(path); err != nil {
		t.Fatal(err)
	}
}

// TestKeeperStartsAfreshOnEarlierVersion: a file an earlier version wrote
// (version 1: states keyed by a hash of the policy with its limits) is an
// upgrade, not damage: Open starts empty, once, without
// DiscardInvalid, and the next snapshot writes this version's format.
func TestKeeperStartsAfreshOnEarlierVersion(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state")
	v1 := Append(nil, 1, sample)
	v1[len(Magic)] = 1
	if err := os.WriteFile(path, v1, 0o600); err != nil {
		t.Fatal(err)
	}
	src := &fakeSource{}
	k, err := Open(src, Options{Path: path})
	if err != nil {
		t.Fatalf("Open of a version 1 file: %v, want a fresh start", err)
	}
	if len(src.recs) != 0 {
		t.Errorf("restored %d records of a version 1 file", len(src.recs))
	}
	if err := k.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Read(path); err != nil {
		t.Errorf("the file after a snapshot: %v, want this version's format", err)
	}
}

// TestKeeperRefusesInvalid: a corrupt, foreign or unreadable file stops
// Open with an error naming it, unless DiscardInvalid, which starts empty
// (but an unreadable file is never discarded: it may be a permission
// mistake, not damage).
func TestKeeperRefusesInvalid(t *testing.T) {
	dir := t.TempDir()
	good := Append(nil, 1, sample)
	for _, tc := range []struct {
		name    string
		content []byte
		want    error
	}{
		{"foreign", []byte("PK\x03\x04 a zip"), ErrForeign},
		{"truncated", good[:len(good)/2], ErrCorrupt},
		{"version", append([]byte(Magic), 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), ErrVersion},
	} {
		path := filepath.Join(dir, tc.name)
		if err := os.WriteFile(path, tc.content, 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := Open(&fakeSource{}, Options{Path: path})
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: Open: %v, want %v naming %s", tc.name, err, tc.want, path)
		}
		src := &fakeSource{}
		k, err := Open(src, Options{Path: path, DiscardInvalid: true})
		if err != nil {
			t.Errorf("%s: Open with DiscardInvalid: %v", tc.name, err)
			continue
		}
		if len(src.recs) != 0 {
			t.Errorf("%s: restored %d records from an invalid file", tc.name, len(src.recs))
		}
		k.Close()
	}
	_, err := Open(&fakeSource{}, Options{Path: dir, DiscardInvalid: true})
	if err == nil || !strings.Contains(err.Error(), dir) {
		t.Errorf("Open of a directory: %v, want an error naming it", err)
	}
}

// TestOpenRefusesWhatCannotBeWritten: a state file that could never be
// written stops the start, with an error naming the path and the remedy,
// instead of serving and losing every count at the first restart.
func TestOpenRefusesWhatCannotBeWritten(t *testing.T) {
	dir := t.TempDir()
	readOnly := filepath.Join(dir, "ro")
	if err := os.Mkdir(readOnly, 0o555); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path, want string
		skipRoot         bool
	}{
		{"missing directory", filepath.Join(dir, "nope", "state"), "nope does not exist: create it", false},
		{"directory as the file", dir, "not a regular file", false},
		{"a file as the directory", filepath.Join(dir, "file", "state"), "is not a directory", false},
		{"read-only directory", filepath.Join(readOnly, "state"), "cannot write in", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "a file as the directory" {
				os.WriteFile(filepath.Join(dir, "file"), nil, 0o644)
			}
			if tc.skipRoot && os.Geteuid() == 0 {
				t.Skip("root writes in a read-only directory")
			}
			src := &fakeSource{}
			k, err := Open(src, Options{Path: tc.path, Now: func() time.Time { return t0 }})
			if err == nil {
				k.Close()
				t.Fatalf("Open(%s) started", tc.path)
			}
			if !strings.Contains(err.Error(), tc.path) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want one naming %s and saying %q", err, tc.path, tc.want)
			}
			if len(src.recs) != 0 {
				t.Error("the source was touched")
			}
		})
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".tmp") {
			t.Errorf("left behind: %s", e.Name())
		}
	}
}

// TestFailedSnapshotsCounted: a periodic snapshot that fails (the directory
// went away) is counted and logged at error level, naming the file.
func TestFailedSnapshotsCounted(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "d")
	os.Mkdir(dir, 0o755)
	path := filepath.Join(dir, "state")
	var logs strings.Builder
	var mu sync.Mutex
	k, err := Open(&fakeSource{recs: sample}, Options{Path: path, Now: func() time.Time { return t0 },
		Logger: slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := k.Save(); err == nil {
		t.Fatal("Save into a removed directory succeeded")
	}
	if k.Failed() != 1 || k.Saved() != 0 {
		t.Errorf("failed %d, saved %d; want 1 and 0", k.Failed(), k.Saved())
	}
	k.Close()
	if k.Failed() != 2 {
		t.Errorf("after the last snapshot failed too: failed %d, want 2", k.Failed())
	}

	// The periodic writer's failure, as an operator sees it.
	os.Mkdir(dir, 0o755)
	k, err = Open(&fakeSource{recs: sample}, Options{Path: path, Interval: time.Millisecond, Now: func() time.Time { return t0 },
		Logger: slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	os.RemoveAll(dir)
	deadline := time.Now().Add(20 * time.Second)
	for {
		mu.Lock()
		out := logs.String()
		mu.Unlock()
		if strings.Contains(out, "level=ERROR") && strings.Contains(out, "snapshot failed") && strings.Contains(out, "file="+path) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no error-level log of the failed periodic snapshot:\n%s", out)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *strings.Builder
}

func (l lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}
