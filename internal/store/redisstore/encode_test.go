package redisstore

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/tiers"
)

// TestEncodePolicy pins the msgpack form of policies that state.lua
// decodes (decpol): a change here is a change of the function's input and
// must be made on both sides.
func TestEncodePolicy(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    tiers.Policy
		want string
	}{
		{"lyft", tiers.Policy{Tiers: []tiers.Tier{{Limit: 1000, Window: time.Second, Active: tiers.Unbounded}}}, "9c000000ce0001e848ce0001e84801cd03e8ce000f4240cb7ff00000000000000000cd3d09"},
		{"penalties", tiers.Policy{HardLimit: 10, GlobalLimit: 500, Tiers: []tiers.Tier{
			{Limit: 5, Window: time.Second, Active: tiers.Unbounded},
			{Limit: 20, Window: time.Second, Active: 5 * time.Second, Cooldown: 15 * time.Second, Skippable: true},
			{Limit: 1, Window: time.Hour, Active: 24 * time.Hour, Cooldown: tiers.Unbounded},
			{Limit: 5000, Window: 300 * time.Second, Active: 300 * time.Second, Cooldown: 86100 * time.Second},
		}}, "dc001e000acd01f401cd3d090405ce000f4240cb7ff000000000000000000114ce000f4240ce004c4b40ce00e4e1c0010101ced693a400d3000000141dd76000cb7ff00000000000000001cd1388ce11e1a300ce11e1a300d3000000140bf5bd0000ce0047868c"},
		{"closed", tiers.Policy{}, "96000000ce0001e848ce0001e84800"},
		{"bucket", tiers.Policy{Kind: tiers.KindTokenBucket, Bucket: tiers.TokenBucket{Capacity: 10, Refill: 4, Per: 3 * time.Second}}, "9501ce000b71b001ce007270e00a"},
		{"bad bucket", tiers.Policy{Kind: tiers.KindTokenBucket, Bucket: tiers.TokenBucket{Capacity: 10, Refill: 0, Per: time.Second}}, "9103"},
		{"fixed minute", tiers.Policy{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Limit: 70000, Unit: tiers.UnitMinute}}, "9302ce00011170ce03938700"},
		{"fixed year", tiers.Policy{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Limit: 3, Unit: tiers.UnitYear}}, "930203d300001cae8c13e000"},
		{"bad unit", tiers.Policy{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Limit: 3, Unit: 99}}, "9103"},
		{"bad kind", tiers.Policy{Kind: 7}, "9103"},
	} {
		got := hex.EncodeToString([]byte(encodePolicy(&tc.p, time.Time{}).arg.(string)))
		if got != tc.want {
			t.Errorf("%s: got %s, want %s", tc.name, got, tc.want)
		}
	}
}

// TestStateKey pins the key layout (keys.go): the hash tags decide which
// keys share a Cluster slot, and the decide library's callers rely on them.
func TestStateKey(t *testing.T) {
	for _, tc := range []struct {
		globalLimit   int64
		state, global string
	}{
		{0, "p:{res/dom}:1f", ""},
		{5, "p:{res}:dom:1f", "p:{res}"},
	} {
		it := store.Item{Key: store.Key{Resource: "res", Domain: "dom", PolicyID: 31}, Policy: &tiers.Policy{GlobalLimit: tc.globalLimit}}
		state, global := stateKey("p:", &it)
		if state != tc.state || global != tc.global {
			t.Errorf("global limit %d: got %q, %q; want %q, %q", tc.globalLimit, state, global, tc.state, tc.global)
		}
		if lock, want := lockKey("p:", state), "p:lock:"+tc.state[len("p:"):]; lock != want {
			t.Errorf("lock key of %q: got %q, want %q", state, lock, want)
		}
		if global != "" && slot(state) != slot(global) {
			t.Errorf("%q and %q: different slots", state, global)
		}
		// Every hash tag of the earlier layout held a ':' (P{R:ID}...):
		// none of these may, so that no key of that layout is read.
		for _, k := range []string{state, global} {
			if i, j := strings.IndexByte(k, '{'), strings.IndexByte(k, '}'); k != "" && strings.Contains(k[i:j], ":") {
				t.Errorf("%q: a ':' in its hash tag, as in the keys of earlier versions", k)
			}
		}
	}
}

// randHeader draws a header that append may write: any mode, the fields
// of the lock modes and of undo, items whose key indices are among nk, a
// plan, an offset or none; numbers up to 2^53 (exact as doubles).
func randHeader(r *rand.Rand) header {
	big := func() int64 { return r.Int64N(1 << 53) }
	h := header{mode: 1 + r.Int64N(modeUndo), now: -1, maxTTL: big(), nk: r.IntN(5)}
	if r.IntN(2) == 0 {
		h.now = big()
	}
	if h.mode == modeUndo {
		h.newest = r.IntN(2) == 0
	} else {
		h.lease = big()
	}
	if h.nk > 0 {
		n := r.IntN(6)
		h.items = make([]headerItem, n)
		for i := range h.items {
			h.items[i] = headerItem{key: 1 + r.IntN(h.nk), global: r.IntN(h.nk + 1), policy: 1 + r.IntN(4),
				hits: big(), min: big(), refund: r.IntN(2) == 0, shadow: r.IntN(2) == 0, entered: r.IntN(2) == 0,
				lead: r.IntN(n + 1), glob: r.IntN(n + 1)}
		}
	}
	switch r.IntN(3) {
	case 0:
		h.off = 1 + big()
	case 1:
		h.off = -1 - big()
	}
	return h
}

// FuzzHeader holds the header's one encoder and one parser to each other:
// a header drawn from seed reads back as it was written, and any bytes
// parseHeader accepts are what append writes of what it read (parseHeader
// never panics).
func FuzzHeader(f *testing.F) {
	for seed := range uint64(8) {
		h := randHeader(rand.New(rand.NewPCG(seed, 1)))
		f.Add(seed, h.append(nil))
	}
	f.Add(uint64(9), []byte{})
	f.Fuzz(func(t *testing.T, seed uint64, b []byte) {
		h := randHeader(rand.New(rand.NewPCG(seed, 1)))
		got, err := parseHeader(h.append(nil))
		if err != nil {
			t.Fatalf("%+v: %v", h, err)
		}
		if diff := cmp.Diff(h, got, cmp.AllowUnexported(header{}, headerItem{}), cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("read back (-written +read):\n%s", diff)
		}
		if h, err := parseHeader(b); err == nil {
			if again := h.append(nil); !bytes.Equal(again, b) {
				t.Fatalf("%x read as %+v, written as %x", b, h, again)
			}
		}
	})
}

// TestParseHeaderErrors: a header append would not write is refused with
// an error naming its field.
func TestParseHeaderErrors(t *testing.T) {
	item := headerItem{key: 1, policy: 1, hits: 3, min: 1, lead: 1}
	good := header{mode: modeDecide, now: -1, maxTTL: 1000, lease: 500, nk: 1, items: []headerItem{item}}
	// set returns good's encoding with double i replaced by v.
	set := func(i int, v float64) []byte {
		b := good.append(nil)
		return append(b[:8*i:8*i], append(appendF64Bits(nil, v), b[8*i+8:]...)...)
	}
	undo := header{mode: modeUndo, now: 5, nk: 1, items: []headerItem{{key: 1, policy: 1, hits: 1}}}
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"short", good.append(nil)[:40], "40 bytes"},
		{"not doubles", good.append(nil)[:60], "60 bytes"},
		{"mode", set(0, 9), "mode 9"},
		{"now", set(1, -2), "now -2"},
		{"fraction", set(2, 1.5), "maxTTL 1.5"},
		{"negative zero", set(3, math.Copysign(0, -1)), "lease -0"},
		{"nk", set(4, -1), "nk -1"},
		{"items", set(5, 2), "for 2 items"},
		{"key", set(6, 2), "item 1: key 2 of 1"},
		{"global", set(7, 3), "item 1: global 3 of 1"},
		{"policy", set(8, 0), "item 1: policy 0"},
		{"hits", set(9, math.NaN()), "hits NaN"},
		{"flags", set(11, 8), "item 1: flags 8"},
		{"plan", set(12, 2), "item 1: plan 2, 0 of 1 items"},
		{"off", append(good.append(nil), appendF64(nil, 0)...), "off 0"},
	} {
		_, err := parseHeader(tc.b)
		if !errors.Is(err, errHeader) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want errHeader naming %q", tc.name, err, tc.want)
		}
	}
	b := undo.append(nil)
	copy(b[24:], appendF64(nil, 2))
	if _, err := parseHeader(b); err == nil || !strings.Contains(err.Error(), "newest 2") {
		t.Errorf("undo with newest 2: %v, want an error naming newest", err)
	}
}

// appendF64Bits appends f as a big-endian double, as it is.
func appendF64Bits(b []byte, f float64) []byte {
	return binary.BigEndian.AppendUint64(b, math.Float64bits(f))
}
