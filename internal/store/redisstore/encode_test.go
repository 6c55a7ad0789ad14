package redisstore

import (
	"encoding/hex"
	"strings"
	"testing"
	"time"

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
