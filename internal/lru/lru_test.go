package lru_test

import (
	"hash/maphash"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/charonlimit/charon/internal/lru"
)

type key struct {
	name string
	id   uint64
}

func hash(k key, seed maphash.Seed) uint64 {
	h := maphash.String(seed, k.name) ^ k.id*0x9e3779b97f4a7c15
	return h ^ h>>29
}

// keys returns the keys of shard 0 from the most recent to the least
// (RemoveIf visits them in that order).
func keys(s *lru.Sharded[key, int]) []string {
	var out []string
	sh := s.Shard(0)
	sh.RemoveIf(func(e *lru.Entry[key, int]) bool {
		out = append(out, e.Key.name)
		return false
	})
	return out
}

func TestEvictsLeastRecentlyUsed(t *testing.T) {
	s := lru.New[key, int](1, 2, hash)
	sh := s.Shard(0)
	sh.Lock()
	defer sh.Unlock()
	a, n := sh.Add(key{"a", 1}, nil)
	a.Value = 1
	b, _ := sh.Add(key{"b", 1}, nil)
	b.Value = 2
	if n != 0 || sh.Len() != 2 {
		t.Fatalf("two adds under the bound: %d evicted, %d entries", n, sh.Len())
	}
	if e := sh.Get(key{"a", 1}); e != a || e.Value != 1 {
		t.Fatalf("Get(a) = %+v, want a's entry", e)
	}
	c, n := sh.Add(key{"c", 1}, nil)
	if n != 1 || sh.Peek(key{"b", 1}) != nil || sh.Len() != 2 {
		t.Fatalf("third add: %d evicted, b still there: %v; want b, the least recent, evicted", n, sh.Peek(key{"b", 1}) != nil)
	}
	if c != b || c.Value != 0 || c.Key != (key{"c", 1}) {
		t.Errorf("the new entry is not b's, emptied: %p vs %p, %+v", c, b, c)
	}
	if diff := cmp.Diff([]string{"c", "a"}, keys(s)); diff != "" {
		t.Errorf("recency (-want +got):\n%s", diff)
	}
	// Peek leaves the order alone, Touch moves to the front.
	sh.Peek(key{"a", 1})
	if diff := cmp.Diff([]string{"c", "a"}, keys(s)); diff != "" {
		t.Errorf("after Peek (-want +got):\n%s", diff)
	}
	sh.Touch(a)
	if diff := cmp.Diff([]string{"a", "c"}, keys(s)); diff != "" {
		t.Errorf("after Touch (-want +got):\n%s", diff)
	}
}

func TestKeepSkipsEntries(t *testing.T) {
	s := lru.New[key, bool](1, 2, hash)
	sh := s.Shard(0)
	sh.Lock()
	defer sh.Unlock()
	pinned := func(e *lru.Entry[key, bool]) bool { return e.Value }
	a, _ := sh.Add(key{"a", 0}, pinned)
	a.Value = true
	sh.Add(key{"b", 0}, pinned)
	if _, n := sh.Add(key{"c", 0}, pinned); n != 1 || sh.Peek(key{"a", 0}) == nil || sh.Peek(key{"b", 0}) != nil {
		t.Fatalf("evicted %d; a kept %v, b kept %v; want b alone evicted", n, sh.Peek(key{"a", 0}) != nil, sh.Peek(key{"b", 0}) != nil)
	}
	sh.Get(key{"c", 0}).Value = true
	if _, n := sh.Add(key{"d", 0}, pinned); n != 0 || sh.Len() != 3 {
		t.Fatalf("every entry kept: %d evicted, %d entries; want none evicted, the shard past its bound", n, sh.Len())
	}
}

func TestUnbounded(t *testing.T) {
	s := lru.New[key, int](1, 0, hash)
	sh := s.Shard(0)
	sh.Lock()
	for i := range 100 {
		if _, n := sh.Add(key{"k", uint64(i)}, nil); n != 0 {
			t.Fatalf("unbounded shard evicted %d", n)
		}
	}
	sh.Unlock()
	if s.Len() != 100 {
		t.Fatalf("Len() = %d, want 100", s.Len())
	}
}

func TestRemoveAndClear(t *testing.T) {
	s := lru.New[key, int](4, 0, hash)
	for i := range 40 {
		k := key{"k", uint64(i)}
		sh := s.ShardOf(k)
		sh.Lock()
		e, _ := sh.Add(k, nil)
		e.Value = i
		sh.Unlock()
	}
	removed := 0
	for i := range s.Shards() {
		sh := s.Shard(i)
		sh.Lock()
		removed += sh.RemoveIf(func(e *lru.Entry[key, int]) bool { return e.Value%2 == 0 })
		sh.Unlock()
	}
	if removed != 20 || s.Len() != 20 {
		t.Fatalf("RemoveIf removed %d, %d left; want 20 and 20", removed, s.Len())
	}
	k := key{"k", 1}
	sh := s.ShardOf(k)
	sh.Lock()
	sh.Remove(sh.Peek(k))
	if sh.Peek(k) != nil {
		t.Error("Remove left the key")
	}
	sh.Unlock()
	s.Clear()
	if s.Len() != 0 {
		t.Fatalf("after Clear: Len() = %d", s.Len())
	}
	sh.Lock()
	if e, _ := sh.Add(k, nil); sh.Get(k) != e {
		t.Error("a cleared shard does not take new entries")
	}
	sh.Unlock()
}

func TestShards(t *testing.T) {
	for _, tt := range []struct{ in, want int }{{-1, 1}, {0, 1}, {1, 1}, {3, 4}, {64, 64}, {65, 128}} {
		if got := lru.New[key, int](tt.in, 0, hash).Shards(); got != tt.want {
			t.Errorf("New(%d).Shards() = %d, want %d", tt.in, got, tt.want)
		}
	}
	s := lru.New[key, int](8, 0, hash)
	seen := map[int]bool{}
	for i := range 1000 {
		k := key{strconv.Itoa(i), uint64(i)}
		j := s.Index(k)
		if j < 0 || j >= 8 || j != s.Index(k) || s.ShardOf(k) != s.Shard(j) {
			t.Fatalf("Index(%v) = %d: out of range or unstable", k, j)
		}
		seen[j] = true
	}
	if len(seen) != 8 {
		t.Errorf("1000 keys in %d of 8 shards", len(seen))
	}
}

func TestConcurrent(t *testing.T) {
	s := lru.New[key, int](4, 8, hash)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 500 {
				use(s, key{"k", uint64((w*7 + i) % 64)})
				if i%50 == 0 {
					_ = s.Len()
				}
			}
		})
	}
	wg.Wait()
	if n := s.Len(); n > 4*8 {
		t.Errorf("%d entries, bound 32", n)
	}
}

// TestZeroAllocs: hits, and adds that evict, allocate nothing.
func TestZeroAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	s, ks := lru.New[key, int](1, 64, hash), benchKeys(256)
	for _, k := range ks[:64] {
		use(s, k)
	}
	i := 0
	if a := testing.AllocsPerRun(1000, func() {
		use(s, ks[i%64])
		i++
	}); a != 0 {
		t.Errorf("Get of a present key: %v allocations, want 0", a)
	}
	if a := testing.AllocsPerRun(1000, func() {
		use(s, ks[64+i%192])
		i++
	}); a != 0 {
		t.Errorf("Add evicting to make room: %v allocations, want 0", a)
	}
}

// use counts a use of k: its entry, added when missing, gets Value+1.
func use(s *lru.Sharded[key, int], k key) {
	sh := s.ShardOf(k)
	sh.Lock()
	e := sh.Get(k)
	if e == nil {
		e, _ = sh.Add(k, nil)
	}
	e.Value++
	sh.Unlock()
}

// benchKeys returns n distinct keys.
func benchKeys(n int) []key {
	ks := make([]key, n)
	for i := range ks {
		ks[i] = key{"resource/" + strconv.Itoa(i), uint64(i)}
	}
	return ks
}

// BenchmarkGet hits every time.
func BenchmarkGet(b *testing.B) {
	s, ks := lru.New[key, int](64, 0, hash), benchKeys(1024)
	for _, k := range ks {
		use(s, k)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		use(s, ks[i&1023])
		i++
	}
}

func BenchmarkGetParallel(b *testing.B) {
	s, ks := lru.New[key, int](64, 0, hash), benchKeys(1024)
	for _, k := range ks {
		use(s, k)
	}
	var start atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := int(start.Add(509))
		for pb.Next() {
			use(s, ks[i&1023])
			i += 7
		}
	})
}

// BenchmarkAddEvict misses every time on a full map: each Add evicts.
func BenchmarkAddEvict(b *testing.B) {
	s, ks := lru.New[key, int](64, 16, hash), benchKeys(4096)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		use(s, ks[i&4095])
		i++
	}
}

// TestShardLockIsItsOwn: a shard's mutex is reached through Lock and
// Unlock only, not an embedded exported sync.Mutex a caller could copy or
// TryLock.
func TestShardLockIsItsOwn(t *testing.T) {
	typ := reflect.TypeFor[lru.Shard[int, int]]()
	for i := range typ.NumField() {
		if f := typ.Field(i); f.IsExported() || f.Anonymous {
			t.Errorf("Shard has the field %s (%v): exported or embedded", f.Name, f.Type)
		}
	}
	var s lru.Shard[int, int]
	s.Lock()
	s.Unlock()
}
