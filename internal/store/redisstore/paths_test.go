package redisstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/tiers"
)

// The fast paths of the decide library (doc.go lists them), each opened by
// one line of code: a test cuts the line off (makes it "if false then") to
// get the general decision on the same calls.
const (
	singleCut  = "if n == 1 and (mode <= 2 or mode == 4) then"
	oneTierCut = "if p.one and gk == 0 then"
	fixedCut   = "if p.kind == 2 and gk == 0 then"
	peekCut    = "if n == 1 and mode == 3 then"
	manyCut    = "if n > 1 and n <= 64 and mode <= 2 then"
)

// fastPathCuts is every fast path's line.
var fastPathCuts = []string{singleCut, oneTierCut, fixedCut, peekCut, manyCut}

// without returns the library's code as written (decideLua) with the lines
// cuts cut off.
func without(t testing.TB, cuts ...string) string {
	t.Helper()
	code := decideLua
	for _, cut := range cuts {
		if strings.Count(code, cut) != 1 {
			t.Fatalf("the decide library has no single %q to cut off", cut)
		}
		code = strings.Replace(code, cut, "if false then", 1)
	}
	return code
}

// loadWithout loads the library into c, and a second library with the lines
// cuts cut off, and returns the second one's function name.
func loadWithout(t testing.TB, c redis.UniversalClient, cuts ...string) string {
	t.Helper()
	ref := without(t, cuts...)
	refVersion := libHash(ref)
	for _, code := range []string{libraryCode, strings.ReplaceAll(ref, "@V@", refVersion)} {
		if err := c.FunctionLoadReplace(context.Background(), code).Err(); err != nil {
			t.Fatal(err)
		}
	}
	return "charon_decide_" + refVersion
}

// generalOnly starts a redis-server whose decide library, under the names
// the store calls, has every fast path cut off: a store on it decides
// every call with the general code (store.Apply's port).
func generalOnly(t *testing.T) *redis.Client {
	t.Helper()
	_, c := singleClient(t)
	code := strings.ReplaceAll(without(t, fastPathCuts...), "@V@", lib.Version)
	if err := c.FunctionLoadReplace(context.Background(), code).Err(); err != nil {
		t.Fatal(err)
	}
	return c
}

// stored returns the state stored at key ("" for none) and its expiry time
// (PEXPIRETIME).
func stored(t *testing.T, c redis.UniversalClient, key string) (string, int64) {
	t.Helper()
	ctx := context.Background()
	st, err := c.Get(ctx, key).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	exp, err := c.Do(ctx, "pexpiretime", key).Int64()
	if err != nil {
		t.Fatal(err)
	}
	return st, exp
}

// f64s appends vs to b as big-endian doubles: a reply of the decide
// library, say.
func f64s(b []byte, vs ...int64) []byte {
	for _, v := range vs {
		b = appendF64(b, v)
	}
	return b
}

// planned returns h encoded with the plan command makes of its items
// (store.Plan), for the key indices they name: items of one state key index
// share a state, items of one global key index a global state.
func planned(h header) []byte {
	items := make([]store.Item, len(h.items))
	global := &tiers.Policy{GlobalLimit: 1}
	for i, hi := range h.items {
		it := &items[i]
		it.Key, it.Policy = store.Key{Resource: fmt.Sprint("s", hi.key)}, &tiers.Policy{}
		if hi.global > 0 {
			it.Key, it.Policy = store.Key{Resource: fmt.Sprint("g", hi.global), Domain: fmt.Sprint(hi.key)}, global
		}
		it.Refund = hi.refund
	}
	var plan store.Plan
	plan.Make(items)
	for i := range h.items {
		h.items[i].lead, h.items[i].glob = plan.Leader(i)+1, plan.Global(i)+1
	}
	return h.append(nil)
}

// item1 is a header item whose flags are those of f (1 refund, 2 shadow),
// the way the random traces draw them.
func item1(key, global, policy int, hits, mn, f int64) headerItem {
	return headerItem{key: key, global: global, policy: policy, hits: hits, min: mn, refund: f&1 != 0, shadow: f&2 != 0}
}

// one is the header of a call of one item on state key 1 (and global key
// global, 0 for none) and policy 1, flags f (item1), with its plan.
func one(mode, now, maxTTL, lease int64, global int, hits, mn, f int64) []byte {
	return planned(header{mode: mode, now: now, maxTTL: maxTTL, lease: lease, nk: max(1, global),
		items: []headerItem{item1(1, global, 1, hits, mn, f)}})
}

// randTake draws a call's hits, 1 to few and now and then (one in odds)
// 0 to many-1, and its minimum, 0 to hits and now and then one more than
// hits (a minimum no call can meet).
func randTake(r *rand.Rand, few, many int64, odds int) (hits, mn int64) {
	hits = 1 + r.Int64N(few)
	if r.IntN(odds) == 0 {
		hits = r.Int64N(many)
	}
	mn = r.Int64N(hits + 1)
	if r.IntN(20) == 0 {
		mn = hits + 1
	}
	return hits, mn
}

// onEach sends the FCALL of one item (ARGV[1] h, the policy arg) to each
// function of fns, on a key of its own (key:i), and returns each one's
// reply, and the state and expiry it left.
func onEach(t *testing.T, c redis.UniversalClient, fns []string, key string, h []byte, arg any) (replies, states []string, expiry []int64) {
	t.Helper()
	for i, fn := range fns {
		k := fmt.Sprintf("%s:%d", key, i)
		rep, err := c.Do(context.Background(), "fcall", fn, 1, k, string(h), "", arg).Text()
		if err != nil {
			t.Fatalf("%s: %s: %v", k, fn, err)
		}
		st, exp := stored(t, c, k)
		replies, states, expiry = append(replies, rep), append(states, st), append(expiry, exp)
	}
	return replies, states, expiry
}

// TestSinglePath demands of the path for a call of one take item (single
// in apply.lua, with the one-tier and fixed-window paths it leads to) the
// same answers, stored states and expiry times as the general decision on
// the same calls: the library is loaded a second time with that path cut
// off, and random calls of one item (policies of every kind, global
// limits, minimums, shadow items and refunds) go to both, on keys of their
// own.
func TestSinglePath(t *testing.T) {
	_, c := singleClient(t)
	ctx := context.Background()
	fns := []string{funcName, loadWithout(t, c, singleCut)}
	r := rand.New(rand.NewPCG(29, 37))
	start := time.Now().Add(time.Hour).UnixMicro()
	calls, granted := 0, 0
	for trace := range 200 {
		p := randPolicy(r)
		now := start + r.Int64N(int64(time.Hour/time.Microsecond))
		arg := encodePolicy(p, time.UnixMicro(now)).arg
		var gk int
		if p.GlobalLimit > 0 {
			gk = 2
		}
		for step := range 40 {
			now += r.Int64N(300_000)
			if r.IntN(10) == 0 {
				now += r.Int64N(10_000_000)
			}
			hits, mn := randTake(r, 4, 150, 6)
			var f int64
			switch r.IntN(10) {
			case 0:
				f = 1 // refund
			case 1:
				f = 2 // shadow
			}
			h := one(modeDecide, now, 3_600_000, 1000, gk, hits, mn, f)
			var replies []string
			var states [2][]string
			var expiry [2][]int64
			for k, fn := range fns {
				keys := []string{fmt.Sprintf("single:%d:%d", k, trace)}
				if gk > 0 {
					keys = append(keys, fmt.Sprintf("single:%d:%d:g", k, trace))
				}
				args := []any{"fcall", fn, len(keys)}
				for _, key := range keys {
					args = append(args, key)
				}
				rep, err := c.Do(ctx, append(args, string(h), "", arg)...).Text()
				if err != nil {
					t.Fatalf("trace %d step %d: %s: %v", trace, step, fn, err)
				}
				replies = append(replies, rep)
				for _, key := range keys {
					st, exp := stored(t, c, key)
					states[k], expiry[k] = append(states[k], st), append(expiry[k], exp)
				}
			}
			calls++
			if rd := (&reader{b: replies[1][16:]}); rd.num()&1 != 0 && f != 1 {
				granted++
			}
			if replies[0] != replies[1] || !slices.Equal(states[0], states[1]) || !slices.Equal(expiry[0], expiry[1]) {
				t.Fatalf("trace %d step %d: policy %+v, now %d, hits %d, min %d, flags %d:\nreply %x\n  ref %x\nstates %x\n   ref %x\nexpiry %d, ref %d",
					trace, step, *p, now, hits, mn, f, replies[0], replies[1], states[0], states[1], expiry[0], expiry[1])
			}
		}
	}
	if granted < calls/4 {
		t.Errorf("%d calls, %d granted: the path is barely exercised", calls, granted)
	}
	t.Logf("%d calls, %d granted", calls, granted)
}

// TestOneTierPath demands of the one-tier path (one1 in fastpaths.lua) the
// same answers, stored states and expiry times as the general decision on
// the same calls: the library is loaded a second time with that path cut
// off, and random calls of one item, mostly of one-tier policies, go to
// both on keys of their own.
func TestOneTierPath(t *testing.T) {
	_, c := singleClient(t)
	fns := []string{funcName, loadWithout(t, c, oneTierCut)}

	r := rand.New(rand.NewPCG(7, 11))
	randTier := func() tiers.Tier {
		tr := tiers.Tier{Limit: 1 + r.Int64N(8), Window: randDur(r, time.Millisecond, 3*time.Second), Active: tiers.Unbounded}
		switch r.IntN(3) {
		case 1:
			tr.Limit = 1 + r.Int64N(2000)
		case 2:
			tr.Limit = 60 + r.Int64N(10)
		}
		if r.IntN(2) == 0 {
			tr.Active = tr.Window * time.Duration(1+r.IntN(5))
		}
		switch r.IntN(4) {
		case 1:
			tr.Cooldown = randDur(r, time.Microsecond, 5*time.Second)
		case 2:
			tr.Cooldown = tr.Window * time.Duration(r.IntN(4))
		case 3:
			if r.IntN(3) == 0 {
				tr.Cooldown = tiers.Unbounded
			}
		}
		tr.Skippable = r.IntN(3) == 0
		return tr
	}
	randPolicy := func() *tiers.Policy {
		p := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{randTier()}}
		switch r.IntN(8) {
		case 0: // a state of more tiers on the same key
			p.Tiers = append(p.Tiers, randTier())
		case 1:
			p.HardLimit = 1 + r.Int64N(100)
		case 2:
			p.Kind, p.Bucket = tiers.KindTokenBucket, tiers.TokenBucket{Capacity: 1 + r.Int64N(200), Refill: 1 + r.Int64N(50), Per: time.Second}
		case 3: // a concurrency limit: its takes are a plain tier's
			p.Tiers[0].Active, p.Tiers[0].Cooldown, p.Concurrency = tiers.Unbounded, 0, true
			return p
		}
		q, _ := tiers.Normalize(*p)
		q.Overdraft = r.IntN(3) == 0 // post-paid
		return &q
	}

	// Future times, so that no state expires on Redis's clock during the
	// test.
	start := time.Now().Add(time.Hour).UnixMicro()
	calls, granted := 0, 0
	for trace := range 300 {
		pols := []*tiers.Policy{randPolicy()}
		if r.IntN(4) == 0 {
			pols = append(pols, randPolicy())
		}
		now := start + r.Int64N(int64(time.Hour/time.Microsecond))
		for step := range 60 {
			switch r.IntN(10) {
			case 0:
			case 1:
				now += r.Int64N(10_000_000)
			case 2:
				now -= r.Int64N(5000)
			default:
				now += r.Int64N(300_000)
			}
			p := pols[0]
			if r.IntN(10) == 0 {
				p = pols[r.IntN(len(pols))]
			}
			hits, mn := randTake(r, 4, 2500, 5)
			var f int64
			if r.IntN(8) == 0 {
				f = 2 // shadow
			}
			maxTTL := int64(3_600_000)
			if r.IntN(10) == 0 {
				maxTTL = 1 + r.Int64N(3000)
			}
			h := one(modeDecide, now, maxTTL, 1000, 0, hits, mn, f)
			arg := encodePolicy(p, time.Time{}).arg
			replies, states, expiry := onEach(t, c, fns, fmt.Sprint("onetier:", trace), h, arg)
			calls++
			rd := &reader{b: replies[1][16:]}
			if rd.num()&1 != 0 {
				granted++
			}
			if replies[0] != replies[1] || states[0] != states[1] || expiry[0] != expiry[1] {
				t.Fatalf("trace %d step %d: policy %+v, now %d, hits %d, min %d, flags %d:\nreply %x\n  ref %x\nstate %x\n  ref %x\nexpiry %d, ref %d",
					trace, step, *p, now, hits, mn, f, replies[0], replies[1], states[0], states[1], expiry[0], expiry[1])
			}
		}
	}
	t.Logf("%d calls, %d granted", calls, granted)
}

// TestFixedPath demands of the fixed-window path for a call of one item
// (fixed1 in fastpaths.lua, which counts in place) the same answers, stored
// counts and expiry times as the general decision on the same calls, which
// reads the count back (load): random calls of one item, with rejections,
// minimums, shadow items and refunds, windows rolling over, time going
// back, and maxTTLs shorter than the window, go to both on keys of their
// own.
func TestFixedPath(t *testing.T) {
	_, c := singleClient(t)
	fns := []string{funcName, loadWithout(t, c, fixedCut)}
	r := rand.New(rand.NewPCG(13, 17))
	start := time.Now().Add(time.Hour).UnixMicro()
	calls, granted, kept := 0, 0, 0
	for trace := range 150 {
		unit := tiers.UnitSecond
		if r.IntN(3) == 0 {
			unit = tiers.UnitMinute
		}
		p := &tiers.Policy{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Limit: 1 + r.Int64N(12), Unit: unit}, Overdraft: trace%3 == 2}
		arg := encodePolicy(p, time.Time{}).arg
		now := start + r.Int64N(int64(time.Hour/time.Microsecond))
		maxTTL := int64(3_600_000)
		if r.IntN(4) == 0 {
			maxTTL = 1 + r.Int64N(90_000) // may be shorter than the window
		}
		for step := range 60 {
			switch r.IntN(12) {
			case 0:
				now += r.Int64N(70_000_000)
			case 1:
				now -= r.Int64N(2_000_000)
			case 2:
				now += 1 + r.Int64N(2000) // a window's first ms
			default:
				now += r.Int64N(200_000)
			}
			hits, mn := randTake(r, 3, 30, 10)
			var f int64
			switch r.IntN(10) {
			case 0:
				f = 1 // refund
			case 1:
				f = 2 // shadow
			}
			h := one(modeDecide, now, maxTTL, 1000, 0, hits, mn, f)
			replies, states, expiry := onEach(t, c, fns, fmt.Sprint("fixed:", trace), h, arg)
			calls++
			if rd := (&reader{b: replies[1][16:]}); rd.num()&1 != 0 {
				granted++
			}
			if states[0] != "" {
				kept++
			}
			if replies[0] != replies[1] || states[0] != states[1] || expiry[0] != expiry[1] {
				t.Fatalf("trace %d step %d: policy %+v, now %d, maxTTL %d, hits %d, min %d, flags %d:\nreply %x\n  ref %x\nstate %q\n  ref %q\nexpiry %d, ref %d",
					trace, step, p.Window, now, maxTTL, hits, mn, f, replies[0], replies[1], states[0], states[1], expiry[0], expiry[1])
			}
		}
	}
	if granted < calls/4 || granted > calls*9/10 || kept < calls/4 {
		t.Errorf("%d calls, %d granted, %d left a count: the path is barely exercised", calls, granted, kept)
	}
	t.Logf("%d calls, %d granted", calls, granted)
}

// TestManyPath demands of the path for several one-tier or fixed-window
// items (many in fastpaths.lua) the same answers, stored states and expiry times as the
// general decision: the library is loaded a second time with that path cut
// off, and random calls of two to four items (mostly one-tier policies on
// distinct keys; sometimes a shared key, a refund, a shadow item, another
// kind of policy, or an item that cannot be granted) go to both, each on
// keys of its own.
func TestManyPath(t *testing.T) {
	_, c := singleClient(t)
	ctx := context.Background()
	fns := []string{funcName, loadWithout(t, c, manyCut)}
	r := rand.New(rand.NewPCG(3, 5))
	randPolicy := func() *tiers.Policy {
		tr := tiers.Tier{Limit: 1 + r.Int64N(20), Window: randDur(r, time.Millisecond, 2*time.Second), Active: tiers.Unbounded}
		if r.IntN(3) == 0 {
			tr.Limit = 60 + r.Int64N(2000)
		}
		p := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{tr}}
		switch r.IntN(10) {
		case 0:
			p.HardLimit = 1 + r.Int64N(50)
		case 1:
			p.Tiers = append(p.Tiers, tiers.Tier{Limit: tr.Limit * 3, Window: tr.Window, Active: 5 * tr.Window, Cooldown: tr.Window})
		case 2, 3: // envoyproxy/ratelimit's fixed window (--fixed-window)
			p.Kind, p.Window = tiers.KindFixedWindow, tiers.FixedWindow{Limit: tr.Limit, Unit: tiers.UnitSecond}
		}
		q, _ := tiers.Normalize(*p)
		q.Overdraft = r.IntN(3) == 0 // post-paid
		return &q
	}
	start := time.Now().Add(time.Hour).UnixMicro()
	calls, fast := 0, 0
	for trace := range 200 {
		n := 2 + r.IntN(3)
		pols := make([]*tiers.Policy, n)
		for i := range pols {
			pols[i] = randPolicy()
		}
		now := start + r.Int64N(int64(time.Hour/time.Microsecond))
		for step := range 40 {
			now += r.Int64N(200_000)
			if r.IntN(10) == 0 {
				now += r.Int64N(5_000_000)
			}
			// Items: state key index (1-based), policy index, hits, min, flags.
			h := header{mode: modeDecide, now: now, maxTTL: 3_600_000, lease: 1000, nk: n}
			for i := range n {
				sk, pi := i+1, i+1
				if r.IntN(15) == 0 {
					sk, pi = 1, 1 // a shared key (its policy): the general path groups them
				}
				hits := 1 + r.Int64N(3)
				if r.IntN(30) == 0 {
					hits = 5000 // cannot be granted
				}
				var f int64
				switch r.IntN(20) {
				case 0:
					f = 1 // refund
				case 1:
					f = 2 // shadow
				}
				h.items = append(h.items, item1(sk, 0, pi, hits, hits, f))
			}
			hdr := planned(h)
			var replies []string
			var states [2][]string
			var expiry [2][]int64
			for k, fn := range fns {
				args := []any{"fcall", fn, n}
				for i := range n {
					args = append(args, fmt.Sprintf("many:%d:%d:%d", k, trace, i))
				}
				args = append(args, string(hdr), "")
				for _, p := range pols {
					args = append(args, encodePolicy(p, time.Time{}).arg)
				}
				rep, err := c.Do(ctx, args...).Text()
				if err != nil {
					t.Fatalf("trace %d step %d: %s: %v", trace, step, fn, err)
				}
				replies = append(replies, rep)
				for i := range n {
					st, exp := stored(t, c, fmt.Sprintf("many:%d:%d:%d", k, trace, i))
					states[k], expiry[k] = append(states[k], st), append(expiry[k], exp)
				}
			}
			calls++
			if replies[0] != replies[1] {
				t.Fatalf("trace %d step %d: replies differ:\n%x\n%x", trace, step, replies[0], replies[1])
			}
			for i := range n {
				if states[0][i] != states[1][i] || expiry[0][i] != expiry[1][i] {
					t.Fatalf("trace %d step %d key %d: state %x expiry %d, ref %x expiry %d", trace, step, i,
						states[0][i], expiry[0][i], states[1][i], expiry[1][i])
				}
			}
			all := true
			rd := &reader{b: replies[0][16:]}
			for range n {
				fl := rd.num()
				all = all && int64(fl)&1 != 0
				for range 8 {
					rd.num()
				}
			}
			if all {
				fast++
			}
		}
	}
	if fast < calls/4 {
		t.Errorf("only %d of %d calls granted whole: the path is barely exercised", fast, calls)
	}
	t.Logf("%d calls, %d granted whole", calls, fast)
}

// TestEarlierLayout: a tiers or global state of an earlier layout (msgpack
// arrays: tags 0 and 9 with each log as m, then m pairs; tags 4 and 10 with
// each log as its hits and a string of records) reads as a fresh state, in
// the function and in Inspect, and is replaced by the current layout.
func TestEarlierLayout(t *testing.T) {
	_, c := singleClient(t)
	s := testStore(t, c, Options{Clock: ClockCaller})
	ctx := context.Background()
	p := &tiers.Policy{Kind: tiers.KindTiers, GlobalLimit: 2, Tiers: []tiers.Tier{{Limit: 2, Window: time.Minute, Active: tiers.Unbounded}}}
	now := time.Unix(1_800_000_000, 0)
	at := now.Add(-time.Second / 2).UnixMicro()
	// Two hits in the tier and in the last second of the domain and of the
	// resource, which would leave no room.
	for i, set := range []string{
		"redis.call('SET', KEYS[1], cmsgpack.pack({0, 1, a, 2, 1, 1, a, 1, a, 2}))\n" +
			"redis.call('SET', KEYS[2], cmsgpack.pack({9, 1, a, 2}))",
		"local r = struct.pack('>dd', a, 2)\n" +
			"redis.call('SET', KEYS[1], cmsgpack.pack({4, 2, r, 1, 1, a, 2, r}))\n" +
			"redis.call('SET', KEYS[2], cmsgpack.pack({10, 2, r}))",
	} {
		it := store.Item{Key: store.Key{Resource: fmt.Sprint("earlier", i), Domain: "d", PolicyID: 1}, Policy: p, Hits: 1, Min: 1}
		sk, gk := stateKey(s.prefix, &it)
		if err := c.Eval(ctx, "local a = tonumber(ARGV[1])\n"+set, []string{sk, gk}, at).Err(); err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		fresh := tiers.Inspect(p, new(tiers.State), new(tiers.Global), now)
		got, err := s.Inspect(ctx, now, &it)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(fresh, got); diff != "" {
			t.Errorf("layout %d: Inspect (-fresh +got):\n%s", i, diff)
		}
		out := make([]tiers.Decision, 1)
		for j := range 2 {
			if err := s.Decide(ctx, now, []store.Item{it}, out); err != nil || !out[0].OK {
				t.Fatalf("layout %d, decision %d: %v %+v, want granted as on a fresh state", i, j, err, out[0])
			}
		}
		st, _ := stored(t, c, sk)
		if v, err := blobInts(st); err != nil || len(v) == 0 || v[0] != int64(tiers.KindTiers) {
			t.Errorf("layout %d: state after the decisions: %v %v, want a tiers state of the current layout", i, v, err)
		}
	}
}

// TestFixedEarlierLayout: a fixed window's state of the earlier layout (a
// msgpack array: kind, used, window start, count) keeps its count, in the
// function and in Inspect, and is replaced by a count.
func TestFixedEarlierLayout(t *testing.T) {
	_, c := singleClient(t)
	s := testStore(t, c, Options{Clock: ClockCaller})
	ctx := context.Background()
	p := &tiers.Policy{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Limit: 3, Unit: tiers.UnitMinute}}
	now := time.Unix(1_800_000_000, 0) // a minute's start
	it := store.Item{Key: store.Key{Resource: "earlierfixed", Domain: "d", PolicyID: 1}, Policy: p, Hits: 1, Min: 1}
	sk, _ := stateKey(s.prefix, &it)
	if err := c.Eval(ctx, "redis.call('SET', KEYS[1], cmsgpack.pack({2, 1, tonumber(ARGV[1]), 2}))", []string{sk}, now.UnixMicro()).Err(); err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	later := now.Add(10 * time.Second)
	if v, err := s.Inspect(ctx, later, &it); err != nil || v.Used != 2 {
		t.Fatalf("Inspect: %+v %v, want 2 used", v, err)
	}
	out := make([]tiers.Decision, 1)
	for j, want := range []bool{true, false} {
		if err := s.Decide(ctx, later, []store.Item{it}, out); err != nil || out[0].OK != want {
			t.Fatalf("decision %d: %v %+v, want OK %v", j, err, out[0], want)
		}
	}
	if st, exp := stored(t, c, sk); st != "3" || exp != now.Add(time.Minute).UnixMilli() {
		t.Errorf("stored %q expiring at %d, want the count 3 expiring at the window's end", st, exp)
	}
}

// FuzzBlobInts: any stored bytes decode to a compact form or an error,
// never a panic, and a decoded form is one SetCompact takes or refuses.
func FuzzBlobInts(f *testing.F) {
	f.Add("\x40\x14\x00\x00\x00\x00\x00\x00")
	f.Add("\x94\x02\x01\x05\x07")
	f.Add("\x93\x0a\x02\xa0")
	p := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 100, Window: time.Second, Active: tiers.Unbounded}}}
	f.Fuzz(func(t *testing.T, b string) {
		v, err := blobInts(b)
		if err != nil || len(v) == 0 {
			return
		}
		var st tiers.State
		var g tiers.Global
		_ = st.SetCompact(p, v)
		_ = g.SetCompact(v)
	})
}

// TestBlobInts pins Inspect's decoding of stored states: the current
// layouts to tiers' compact form, earlier ones to a fresh state, and a
// malformed string to an error.
func TestBlobInts(t *testing.T) {
	doubles := func(fs ...float64) string {
		var b []byte
		for _, f := range fs {
			b = binary.BigEndian.AppendUint64(b, math.Float64bits(f))
		}
		return string(b)
	}
	for _, tc := range []struct {
		name string
		blob any
		want []int64
		err  bool
	}{
		{"none", nil, nil, false},
		{"tiers", doubles(5, 1, 3, 1, 1, 700, 3, 2, 500, 3, 600, 1, 700, 2), []int64{0, 1, 500, 3, 1, 1, 700, 2, 600, 1, 700, 2}, false},
		{"tiers, no tier entered", doubles(5, 0, 0, 0), []int64{0, 0, 0}, false},
		{"global", doubles(11, 4, 1, 900, 4), []int64{9, 1, 900, 4}, false},
		{"fixed window", "\x94\x02\x01\xcd\x03\xe8\x07", []int64{2, 1, 1000, 7}, false},
		{"earlier tiers layout", "\x94\x00\x00\x00\x00", nil, false},
		{"earlier global layout", "\x93\x0a\x00\xa0", nil, false},
		{"hits not the records' sum", doubles(11, 5, 1, 900, 4), nil, true},
		{"a fraction inside", doubles(5, 1, 3, 1, 1, 700.5, 3, 2, 500, 3, 600, 1, 700, 2), nil, true},
		{"records missing", doubles(5, 1, 3, 1, 1, 700, 3, 2, 500, 3), nil, true},
		{"not a whole double", doubles(5, 0, 0, 0) + "\x00", nil, true},
	} {
		got, err := blobInts(tc.blob)
		if (err != nil) != tc.err || !slices.Equal(got, tc.want) {
			t.Errorf("%s: got %v, %v; want %v, error %v", tc.name, got, err, tc.want, tc.err)
		}
	}
}

// TestCountExpiresAtOnce: a count the function creates has its expiry at
// once, so that a call failing after it (here on a second item whose
// policy is missing) leaves no count that would never expire.
func TestCountExpiresAtOnce(t *testing.T) {
	_, c := singleClient(t)
	ctx := context.Background()
	if err := lib.Load(ctx, c); err != nil {
		t.Fatal(err)
	}
	fixed := &tiers.Policy{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Limit: 5, Unit: tiers.UnitMinute}}
	h := planned(header{mode: modeDecide, now: -1, maxTTL: 3_600_000, lease: 1000, nk: 2, items: []headerItem{item1(1, 0, 1, 1, 1, 0), item1(2, 0, 7, 1, 1, 0)}})
	err := c.Do(ctx, "fcall", funcName, 2, "expire:count", "expire:other", string(h), "", encodePolicy(fixed, time.Time{}).arg).Err()
	if err == nil {
		t.Fatal("a call whose second item has no policy succeeded")
	}
	st, exp := stored(t, c, "expire:count")
	if st != "" && exp < 0 {
		t.Fatalf("count %q left with no expiry (%d)", st, exp)
	}
}

// FuzzCountInts: any stored string, expiry and instant read as a fixed
// window's count give a compact form or an error, never a panic; a form
// is of the window containing the instant or of a later one (starting after
// it), and SetCompact takes it.
func FuzzCountInts(f *testing.F) {
	f.Add("7", int64(1_800_000_001_000), int64(1_800_000_000_300_000))
	f.Add("12345678901234567890", int64(-1), int64(0))
	f.Add("", int64(5), int64(-5))
	p := &tiers.Policy{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Limit: 10, Unit: tiers.UnitSecond}}
	f.Fuzz(func(t *testing.T, str string, expiryMs, nowMicros int64) {
		if !isCount(str) {
			return
		}
		expiryMs = min(max(expiryMs, -2), math.MaxInt64/int64(time.Millisecond))
		now := time.UnixMicro(nowMicros)
		v, err := countInts(str, time.Duration(expiryMs)*time.Millisecond, now, time.Second)
		if err != nil || v == nil {
			return
		}
		w := time.Second.Microseconds()
		cur := nowMicros - ((nowMicros%w)+w)%w
		if len(v) != 4 || v[0] != int64(tiers.KindFixedWindow) || v[1] != 1 || v[2] < cur || v[2]%w != cur%w || (v[2] != cur && v[2] <= nowMicros) {
			t.Fatalf("%q expiring %d at %d: %v, want the window at %d or a later one", str, expiryMs, nowMicros, v, cur)
		}
		var st tiers.State
		if err := st.SetCompact(p, v); err != nil && v[3] >= 0 {
			t.Fatalf("SetCompact(%v): %v", v, err)
		}
	})
}

// TestCountInts pins Inspect's reading of a fixed window's count: the
// window it is of follows from its key's expiry.
func TestCountInts(t *testing.T) {
	now := time.Unix(1_800_000_000, 300_000_000) // 300 ms into a second
	start := time.Unix(1_800_000_000, 0).UnixMicro()
	ms := func(sec int64) time.Duration { return time.Duration(sec) * time.Second }
	for _, tc := range []struct {
		name   string
		count  string
		expiry time.Duration
		want   []int64
		err    bool
	}{
		{"this window", "7", ms(1_800_000_001), []int64{2, 1, start, 7}, false},
		{"this window, expiry capped", "7", ms(1_800_000_000) + 500*time.Millisecond, []int64{2, 1, start, 7}, false},
		{"an earlier window", "7", ms(1_800_000_000), nil, false},
		{"a later window", "7", ms(1_800_000_003), []int64{2, 1, start + 2_000_000, 7}, false},
		{"no expiry", "7", -1, nil, false},
		{"not a number", "7x", ms(1_800_000_001), nil, true},
	} {
		if !isCount(tc.count) && !tc.err {
			t.Errorf("%s: %q is not a count", tc.name, tc.count)
		}
		got, err := countInts(tc.count, tc.expiry, now, time.Second)
		if (err != nil) != tc.err || !slices.Equal(got, tc.want) {
			t.Errorf("%s: got %v, %v; want %v, error %v", tc.name, got, err, tc.want, tc.err)
		}
	}
	for _, s := range []string{"", "-1", "1.5", "\x94\x02", "12345678901234567890"} {
		if isCount(s) {
			t.Errorf("isCount(%q) = true", s)
		}
	}
}

// TestPeekPath demands of the prepare path for one item (a two-step's slot
// holding one take item on a fixed window or one tier: fixed0 and one1 with
// peek in fastpaths.lua) the same answers as the general prediction, the state
// left as it was and the key locked: random histories of one-item decisions
// go to two keys alike, and a prepare of a random item, then its release,
// to each key, one through each library.
func TestPeekPath(t *testing.T) {
	_, c := singleClient(t)
	fns := []string{funcName, loadWithout(t, c, peekCut)}
	ctx := context.Background()
	r := rand.New(rand.NewPCG(19, 23))
	start := time.Now().Add(time.Hour).UnixMicro()
	calls, granted := 0, 0
	for trace := range 120 {
		var p *tiers.Policy
		switch r.IntN(3) {
		case 0:
			p = &tiers.Policy{Kind: tiers.KindFixedWindow, Window: tiers.FixedWindow{Limit: 1 + r.Int64N(12), Unit: tiers.UnitSecond}}
		case 1:
			p = &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 1 + r.Int64N(8), Window: randDur(r, time.Millisecond, 3*time.Second), Active: tiers.Unbounded}}}
		default:
			w := randDur(r, time.Millisecond, time.Second)
			p = &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 60 + r.Int64N(2000), Window: w, Active: w * time.Duration(1+r.IntN(4)), Cooldown: w}}}
		}
		arg := encodePolicy(p, time.Time{}).arg
		now := start + r.Int64N(int64(time.Hour/time.Microsecond))
		keys := []string{fmt.Sprint("peek:", trace, ":0"), fmt.Sprint("peek:", trace, ":1")}
		for step := range 40 {
			now += r.Int64N(300_000)
			hits, mn := randTake(r, 3, 40, 8)
			var f int64
			if r.IntN(8) == 0 {
				f = 2 // shadow
			}
			if r.IntN(2) == 0 {
				// History: the same decision on both keys.
				h := one(modeDecide, now, 3_600_000, 1000, 0, hits, mn, 0)
				for _, k := range keys {
					if err := c.Do(ctx, "fcall", funcName, 1, k, string(h), "", arg).Err(); err != nil {
						t.Fatal(err)
					}
				}
				continue
			}
			h := one(modePrepare, now, 3_600_000, 5000, 0, hits, mn, f)
			var replies, states []string
			for i, k := range keys {
				before, _ := stored(t, c, k)
				rep, err := c.Do(ctx, "fcall", fns[i], 2, k, k+":lock", string(h), "tok", arg).Text()
				if err != nil {
					t.Fatalf("%s: %v", k, err)
				}
				after, _ := stored(t, c, k)
				if before != after {
					t.Fatalf("trace %d step %d: the prepare on %s changed the state", trace, step, k)
				}
				if ttl := c.PTTL(ctx, k+":lock").Val(); ttl <= 0 {
					t.Fatalf("trace %d step %d: the prepare on %s left no lock (%v)", trace, step, k, ttl)
				}
				rel := one(modeRelease, now, 3_600_000, 5000, 0, hits, mn, f)
				if err := c.Do(ctx, "fcall", funcName, 2, k, k+":lock", string(rel), "tok", arg).Err(); err != nil {
					t.Fatal(err)
				}
				replies, states = append(replies, rep), append(states, after)
			}
			calls++
			if rd := (&reader{b: replies[1][16:]}); rd.num()&1 != 0 {
				granted++
			}
			if replies[0] != replies[1] || states[0] != states[1] {
				t.Fatalf("trace %d step %d: policy %+v, now %d, hits %d, min %d, flags %d:\nreply %x\n  ref %x", trace, step, p, now, hits, mn, f, replies[0], replies[1])
			}
		}
	}
	if granted < calls/4 || granted > calls*19/20 {
		t.Errorf("%d prepares, %d granted: the path is barely exercised", calls, granted)
	}
	t.Logf("%d prepares, %d granted", calls, granted)
}
