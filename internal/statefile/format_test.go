package statefile

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

var sample = []Record{
	{Resource: "api/tenant", Domain: "acme", PolicyID: 7, Forget: 1_900_000_000_000_000, State: []int64{3, 1, 1_899_999_000_000_000, 42}},
	{Resource: "api/user", Domain: "bob", PolicyID: 1 << 63, Forget: Never, State: []int64{0, 1, 5, 2, 1, 1, 1, 1, 5, 2}},
	{Resource: "api/user", Forget: 12, State: []int64{9, 2, 1, 3, 2, 4}},
	// A token bucket owing 3 credits of 10^6 units, with its unit.
	{Resource: "api/credits", Domain: "acme", PolicyID: 5, Forget: 1_900_000_000_000_000, State: []int64{1, 1, 1_899_999_000_000_000, 3_000_000, 1_000_000}},
}

func TestRoundTrip(t *testing.T) {
	for _, recs := range [][]Record{sample, {}} {
		got, written, err := Decode(Append(nil, 1234, recs))
		if err != nil {
			t.Fatal(err)
		}
		if written != 1234 {
			t.Errorf("written %d, want 1234", written)
		}
		if diff := cmp.Diff(recs, got); diff != "" {
			t.Errorf("round trip (-want +got):\n%s", diff)
		}
	}
}

// TestDecodeRefuses: a foreign file, another version, a truncated or
// damaged one, and a well-checksummed file whose records are not states are
// refused, each with its error.
func TestDecodeRefuses(t *testing.T) {
	good := Append(nil, 1, sample)
	flip := func(i int) []byte {
		b := bytes.Clone(good)
		b[i] ^= 0x10
		return b
	}
	v3 := bytes.Clone(good)
	v3[len(Magic)] = 3
	v1 := bytes.Clone(good)
	v1[len(Magic)] = 1
	for _, tc := range []struct {
		name string
		in   []byte
		want error
		has  string
	}{
		{"empty", nil, ErrForeign, ""},
		{"json", []byte(`{"states": []}`), ErrForeign, ""},
		{"magic only", []byte(Magic), ErrCorrupt, "truncated header"},
		{"version 3", v3, ErrVersion, "version 3"},
		{"version 1", v1, ErrEarlier, "version 1"},
		{"truncated", good[:len(good)-7], ErrCorrupt, "checksum"},
		{"cut to the header", good[:headerLen+trailerLen], ErrCorrupt, "checksum"},
		{"a flipped bit", flip(headerLen + 20), ErrCorrupt, "checksum"},
		{"a flipped checksum", flip(len(good) - 1), ErrCorrupt, "checksum"},
		{"bad state", Append(nil, 1, []Record{{Resource: "r", Domain: "d", State: []int64{2, 1}}}), ErrCorrupt, `record 1 of 1 (r "d")`},
		{"unknown kind", Append(nil, 1, []Record{{Resource: "r", State: []int64{300, 1, 2, 3}}}), ErrCorrupt, "unknown state kind 300"},
		{"empty state", Append(nil, 1, []Record{{Resource: "r"}}), ErrCorrupt, "empty state"},
		{"a bucket without its unit", Append(nil, 1, []Record{{Resource: "r", Domain: "d", State: []int64{1, 1, 5, 2}}}), ErrCorrupt, `record 1 of 1 (r "d")`},
		{"global with a domain", Append(nil, 1, []Record{{Resource: "r", Domain: "d", State: []int64{9, 0}}}), ErrCorrupt, "global"},
		{"count too high", withCount(good, 5), ErrCorrupt, "record 5 of 5 is cut short"},
		{"count too low", withCount(good, 3), ErrCorrupt, "after the last of 3 records"},
	} {
		_, _, err := Decode(tc.in)
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.has) {
			t.Errorf("%s: %v, want %v with %q", tc.name, err, tc.want, tc.has)
		}
	}
}

// withCount is b with its record count set to n and its checksum made
// right again.
func withCount(b []byte, n byte) []byte {
	c := bytes.Clone(b[:len(b)-trailerLen])
	c[len(Magic)+4] = n
	return binary.LittleEndian.AppendUint32(c, crc32.Checksum(c, castagnoli))
}

func TestReadNamesTheFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "charon.state")
	if err := os.WriteFile(path, []byte("not a state"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, _, err := Read(path)
	if !errors.Is(err, ErrForeign) || !strings.Contains(err.Error(), path) {
		t.Errorf("Read: %v, want ErrForeign naming %s", err, path)
	}
	if err := Write(path, 5, sample); err != nil {
		t.Fatal(err)
	}
	recs, _, err := Read(path)
	if err != nil || len(recs) != len(sample) {
		t.Fatalf("Read after Write: %d records, %v", len(recs), err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("the directory holds %d entries, want the state file alone (no temporary file left)", len(ents))
	}
}

// FuzzDecode: Decode never panics, and what it accepts encodes to a file
// that decodes to the same records. The input's checksum is made right (a
// fuzzer would not find one), so the records' decoding is what is fuzzed;
// the checksum is tested above.
func FuzzDecode(f *testing.F) {
	f.Add(Append(nil, 1, sample))
	f.Add(Append(nil, 0, nil))
	f.Add([]byte(Magic))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) >= headerLen+trailerLen {
			b = binary.LittleEndian.AppendUint32(b[:len(b)-trailerLen:len(b)-trailerLen], crc32.Checksum(b[:len(b)-trailerLen], castagnoli))
		}
		recs, written, err := Decode(b)
		if err != nil {
			return
		}
		again, w2, err := Decode(Append(nil, written, recs))
		if err != nil || w2 != written {
			t.Fatalf("accepted %x, but not its re-encoding: %v", b, err)
		}
		if diff := cmp.Diff(recs, again, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("accepted %x; re-encoded (-first +second):\n%s", b, diff)
		}
	})
}
