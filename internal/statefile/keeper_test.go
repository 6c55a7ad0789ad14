package statefile

import (
	"errors"
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
	if diff := cmp.Diff(sample[:2], restored.Snapshot(t0)); diff != "" {
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
