package offenders

import (
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/charonlimit/charon/descriptors"
)

// checkBounds checks Space-Saving's guarantees of items against the true
// counts: every item brackets its value's count, no error exceeds N/K, and
// every value with more than N/K is listed.
func checkBounds(t *testing.T, items []Item, total uint64, k int, truth map[string]uint64) {
	t.Helper()
	var sum uint64
	for _, n := range truth {
		sum += n
	}
	if total != sum {
		t.Errorf("total %d, want %d", total, sum)
	}
	bound := total / uint64(k)
	listed := map[string]bool{}
	for _, it := range items {
		listed[it.Value] = true
		tr := truth[it.Value]
		if it.Count-it.Err > tr || tr > it.Count {
			t.Errorf("%q: count %d error %d does not bracket its true count %d", it.Value, it.Count, it.Err, tr)
		}
		if it.Err > bound {
			t.Errorf("%q: error %d above N/K = %d", it.Value, it.Err, bound)
		}
	}
	for v, n := range truth {
		if n > bound && !listed[v] {
			t.Errorf("%q has %d hits, above N/K = %d, and is not listed", v, n, bound)
		}
	}
}

// streams are adversarial and ordinary orders of weighted values.
func streams() map[string][]struct {
	v string
	w uint64
} {
	type ev = struct {
		v string
		w uint64
	}
	out := map[string][]ev{}
	// Three heavy values among thousands of light ones, interleaved.
	var mixed []ev
	for i := range 20000 {
		mixed = append(mixed, ev{"light" + strconv.Itoa(i%5000), 1})
		if i%10 == 0 {
			mixed = append(mixed, ev{"heavy" + strconv.Itoa(i%3), 1})
		}
	}
	out["heavy among light"] = mixed
	// The heavy values come first, then a flood of distinct values that
	// evicts them over and over.
	var flood []ev
	for i := range 3 {
		flood = append(flood, ev{"early" + strconv.Itoa(i), 500})
	}
	for i := range 50000 {
		flood = append(flood, ev{"new" + strconv.Itoa(i), 1})
	}
	out["heavy first, then a flood"] = flood
	// Values in ascending counts, round robin: each eviction takes the value
	// about to be seen again.
	var rr []ev
	for round := range 200 {
		for v := range 64 {
			if v <= round%64 {
				rr = append(rr, ev{"rr" + strconv.Itoa(v), 1})
			}
		}
	}
	out["round robin"] = rr
	// Zipf, weighted.
	r := rand.New(rand.NewPCG(1, 2))
	z := rand.NewZipf(r, 1.2, 1, 100000)
	var zipf []ev
	for range 50000 {
		zipf = append(zipf, ev{"z" + strconv.FormatUint(z.Uint64(), 10), 1 + r.Uint64N(5)})
	}
	out["zipf, weighted"] = zipf
	return out
}

func TestSketchBounds(t *testing.T) {
	for name, st := range streams() {
		for _, k := range []int{1, 8, 32} {
			t.Run(name+"/k="+strconv.Itoa(k), func(t *testing.T) {
				s := NewSketch(k)
				truth := map[string]uint64{}
				for _, e := range st {
					s.Add(Hash(e.v), e.v, nil, e.w)
					truth[e.v] += e.w
				}
				items := s.Items()
				if len(items) > k {
					t.Fatalf("%d items, want at most %d", len(items), k)
				}
				checkBounds(t, items, s.Total(), k, truth)
			})
		}
	}
}

// TestMergeBounds splits each stream in parts (epochs, replicas): the merged
// answer keeps the bracket and the bound over the whole stream.
func TestMergeBounds(t *testing.T) {
	const k = 16
	for name, st := range streams() {
		for _, parts := range []int{2, 3} {
			t.Run(name+"/"+strconv.Itoa(parts), func(t *testing.T) {
				ss := make([]*Sketch, parts)
				for i := range ss {
					ss[i] = NewSketch(k)
				}
				truth := map[string]uint64{}
				for i, e := range st {
					// Contiguous parts, as epochs are.
					ss[i*parts/len(st)].Add(Hash(e.v), e.v, nil, e.w)
					truth[e.v] += e.w
				}
				var ps []Part
				for _, s := range ss {
					ps = append(ps, Part{Items: s.Items(), Total: s.Total(), Floor: s.Floor()})
				}
				items, total := Merge(ps...)
				checkBounds(t, items, total, k, truth)
			})
		}
	}
}

// TestSketchMillionValues adds a million distinct values: the sketch keeps
// K slots, allocates nothing per Add, and long values become stand-ins.
func TestSketchMillionValues(t *testing.T) {
	s := NewSketch(32)
	before := Bytes(32)
	vals := make([]string, 1<<20)
	for i := range vals {
		vals[i] = "tenant-" + strconv.Itoa(i)
	}
	es := []descriptors.Entry{{Key: "tenant", Value: "x"}}
	i := 0
	allocs := testing.AllocsPerRun(len(vals)-1, func() {
		s.Add(Hash(vals[i]), vals[i], es, 1)
		i++
	})
	if allocs != 0 {
		t.Errorf("%v allocations per Add, want 0", allocs)
	}
	if len(s.slots) != 32 || cap(s.slots) != 32 || Bytes(32) != before {
		t.Errorf("%d slots (cap %d), want 32", len(s.slots), cap(s.slots))
	}
	long := strings.Repeat("v", 300)
	s.Add(Hash(long), long, nil, 1000)
	if got := s.Items()[0].Value; len(got) != KeyCap || got != StandIn(long, KeyCap) || !strings.HasPrefix(got, "vvv") || got[KeyCap-17] != '~' {
		t.Errorf("long value listed as %q (%d bytes), want its %d-byte stand-in", got, len(got), KeyCap)
	}
}

func TestDescriptorText(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries []descriptors.Entry
		want    string
	}{
		{"one", []descriptors.Entry{{Key: "user", Value: "alice"}}, "user=alice"},
		{"two", []descriptors.Entry{{Key: "path", Value: "/login"}, {Key: "user", Value: "bob"}}, "path=/login,user=bob"},
		{"comma", []descriptors.Entry{{Key: "user", Value: "a,b"}}, ""},
		{"not ASCII", []descriptors.Entry{{Key: "user", Value: "caf\xe9"}}, ""},
		{"too long", []descriptors.Entry{{Key: "user", Value: strings.Repeat("x", DescCap)}}, ""},
		{"none", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewSketch(1)
			s.Add(1, "v", tc.entries, 1)
			if got := s.Items()[0].Descriptor; got != tc.want {
				t.Errorf("descriptor %q, want %q", got, tc.want)
			}
		})
	}
}

func TestMergeFloors(t *testing.T) {
	a := Part{Items: []Item{{Value: "x", Count: 10, Err: 2}, {Value: "y", Count: 5}}, Total: 15, Floor: 5}
	b := Part{Items: []Item{{Value: "x", Count: 3}}, Total: 3, Floor: 0}
	c := Part{Items: []Item{{Value: "z", Count: 9, Err: 4}}, Total: 9, Floor: 9}
	items, total := Merge(a, b, c)
	// y and z tie: by value.
	want := []Item{{Value: "x", Count: 22, Err: 11}, {Value: "y", Count: 14, Err: 9}, {Value: "z", Count: 14, Err: 9}}
	if diff := cmp.Diff(want, items); diff != "" || total != 27 {
		t.Errorf("Merge: total %d (want 27), items (-want +got):\n%s", total, diff)
	}
}

// FuzzSketch checks the bracket and the bound on arbitrary streams.
func FuzzSketch(f *testing.F) {
	f.Add([]byte("aaabbbcccddd"), uint8(2))
	f.Add([]byte{0, 1, 2, 3, 0, 0, 0, 9, 9, 9, 9}, uint8(3))
	f.Fuzz(func(t *testing.T, b []byte, k uint8) {
		kk := int(k%16) + 1
		s := NewSketch(kk)
		truth := map[string]uint64{}
		for i := 0; i+1 < len(b); i += 2 {
			v, w := string(b[i:i+1]), uint64(b[i+1]%8)+1
			s.Add(Hash(v), v, nil, w)
			truth[v] += w
		}
		checkBounds(t, s.Items(), s.Total(), kk, truth)
	})
}

func BenchmarkSketchAdd(b *testing.B) {
	for _, k := range []int{8, 32, 128} {
		b.Run("k="+strconv.Itoa(k), func(b *testing.B) {
			s := NewSketch(k)
			vals := make([]string, 4096)
			for i := range vals {
				vals[i] = "tenant-" + strconv.Itoa(i%(k*2))
			}
			es := []descriptors.Entry{{Key: "tenant", Value: "x"}}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				v := vals[i%len(vals)]
				s.Add(Hash(v), v, es, 1)
				i++
			}
		})
	}
}
