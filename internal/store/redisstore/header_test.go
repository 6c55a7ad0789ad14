package redisstore

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/charonlimit/charon/tiers"
)

// luaRig sends FCALLs of the decide library, their headers written by
// header.append, to a real Redis, and reads what they did.
type luaRig struct {
	t *testing.T
	c *redis.Client
	// now is a caller's instant an hour ahead of Redis's clock: keys that
	// expire at a window's end after it are alive.
	now int64
}

// luaReply is what a call answered: its status and instant, and per item
// its flags and grant.
type luaReply struct {
	status, now int64
	flags       []int64
	granted     []int64
}

// call sends the FCALL of h (its items' plan as given) on keys, token and
// policies, and returns its reply; it fails the test on an error.
func (x *luaRig) call(h header, token string, keys []string, pols ...*tiers.Policy) luaReply {
	x.t.Helper()
	args := []any{"fcall", funcName, len(keys)}
	for _, k := range keys {
		args = append(args, k)
	}
	args = append(args, h.append(nil), token)
	for _, p := range pols {
		args = append(args, encodePolicy(p, time.UnixMicro(x.now)).arg)
	}
	res, err := x.c.Do(context.Background(), args...).Text()
	if err != nil {
		x.t.Fatalf("FCALL of %+v: %v", h, err)
	}
	r := reader{b: res}
	rep := luaReply{status: r.num(), now: r.num()}
	for range h.items {
		if rep.status != statusDone || h.mode == modeUndo || h.mode == modeRelease || h.mode == modeSeal {
			break
		}
		rep.flags = append(rep.flags, r.num())
		rep.granted = append(rep.granted, r.num())
		for range replyItem - 2 {
			r.num()
		}
	}
	if r.err != nil || r.b != "" {
		x.t.Fatalf("FCALL of %+v: reply %x", h, res)
	}
	return rep
}

// take is the header of a call of one take item in mode on KEYS[1] and
// policy 1 at x.now.
func (x *luaRig) take(mode int64, hits, mn int64) header {
	return header{mode: mode, now: x.now, maxTTL: 3_600_000, lease: 60_000, nk: 1,
		items: []headerItem{{key: 1, policy: 1, hits: hits, min: mn, lead: 1}}}
}

// left returns what a call of hits on key (policy p) is granted at x.now,
// which it takes.
func (x *luaRig) left(key string, p *tiers.Policy) int64 {
	x.t.Helper()
	return x.call(x.take(modeDecide, 100, 0), "", []string{key}, p).granted[0]
}

// exists reports whether key is stored.
func (x *luaRig) exists(key string) bool {
	x.t.Helper()
	n, err := x.c.Exists(context.Background(), key).Result()
	if err != nil {
		x.t.Fatal(err)
	}
	return n == 1
}

// pttl returns key's time to live in ms (negative: none, or no key).
func (x *luaRig) pttl(key string) int64 {
	x.t.Helper()
	d, err := x.c.PTTL(context.Background(), key).Result()
	if err != nil {
		x.t.Fatal(err)
	}
	if d < 0 {
		return int64(d)
	}
	return d.Milliseconds()
}

// TestHeaderRead: the decide library reads every field and flag of the
// header as header.append writes it. Each case sends calls whose headers
// differ in one field (or flag) and shows Redis doing what that field
// says: every mode, now (a caller's, and Redis's clock), maxTTL, the lease
// (a prepare's, a seal's) and undo's newest, nk (where the lock keys
// start), each item's key, global key, policy, hits, min and its flags
// (refund, shadow, entered), the plan (lead, glob), and the offset after it
// (a reservation, a give-back).
func TestHeaderRead(t *testing.T) {
	_, c := singleClient(t)
	if err := lib.Load(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	five := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 5, Window: time.Hour, Active: tiers.Unbounded}}}
	two := &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 2, Window: time.Hour, Active: tiers.Unbounded}}}
	global := &tiers.Policy{Kind: tiers.KindTiers, GlobalLimit: 4, Tiers: []tiers.Tier{{Limit: 10, Window: time.Hour, Active: tiers.Unbounded}}}
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, x *luaRig, k func(string) string)
	}{
		{"mode decide, now, hits", func(t *testing.T, x *luaRig, k func(string) string) {
			rep := x.call(x.take(modeDecide, 3, 1), "", []string{k("a")}, five)
			if rep.status != statusDone || rep.now != x.now || rep.flags[0]&replyOK == 0 || rep.granted[0] != 3 {
				t.Errorf("reply %+v, want done at %d, 3 granted", rep, x.now)
			}
			if got := x.left(k("a"), five); got != 2 {
				t.Errorf("%d left of 5 after 3 hits, want 2", got)
			}
		}},
		{"min", func(t *testing.T, x *luaRig, k func(string) string) {
			if rep := x.call(x.take(modeDecide, 3, 6), "", []string{k("a")}, five); rep.flags[0]&replyOK != 0 || rep.granted[0] != 0 {
				t.Errorf("3 hits, at least 6, of 5: %+v, want refused", rep)
			}
		}},
		{"now -1: Redis's clock", func(t *testing.T, x *luaRig, k func(string) string) {
			before := redisMicros(t, x.c)
			h := x.take(modeDecide, 1, 1)
			h.now = -1
			rep := x.call(h, "", []string{k("a")}, five)
			if after := redisMicros(t, x.c); rep.now < before || rep.now > after {
				t.Errorf("decided at %d, want Redis's TIME, between %d and %d", rep.now, before, after)
			}
		}},
		{"maxTTL", func(t *testing.T, x *luaRig, k func(string) string) {
			h := x.take(modeDecide, 1, 1)
			h.maxTTL = 5000
			x.call(h, "", []string{k("a")}, five)
			exp, err := x.c.Do(context.Background(), "pexpiretime", k("a")).Int64()
			if ms := x.now / 1000; err != nil || exp <= ms || exp > ms+5000 {
				t.Errorf("expiry %d ms (%v), want within maxTTL of now, %d ms", exp, err, ms)
			}
		}},
		{"key, policy", func(t *testing.T, x *luaRig, k func(string) string) {
			// Two items (a call of one item has one policy, ARGV[3]): the
			// first on KEYS[2] and ARGV[2+2], a limit of 2; the second on
			// KEYS[1] and ARGV[2+1], a limit of 5.
			h := header{mode: modeDecide, now: x.now, maxTTL: 3_600_000, nk: 2, items: []headerItem{
				{key: 2, policy: 2, hits: 5, lead: 1},
				{key: 1, policy: 1, hits: 5, lead: 2},
			}}
			if rep := x.call(h, "", []string{k("a"), k("b")}, five, two); rep.granted[0] != 2 || rep.granted[1] != 5 {
				t.Errorf("5 hits on policy 2 (a limit of 2), 5 on policy 1 (5): %+v, want 2 and 5 granted", rep)
			}
			if got := x.left(k("b"), two); got != 0 {
				t.Errorf("KEYS[2] has %d of 2 left, want none", got)
			}
		}},
		{"global", func(t *testing.T, x *luaRig, k func(string) string) {
			h := x.take(modeDecide, 3, 1)
			h.nk, h.items[0].global = 2, 2
			x.call(h, "", []string{k("a"), k("g")}, global)
			h.items[0].min = 2
			rep := x.call(h, "", []string{k("b"), k("g")}, global)
			if rep.flags[0]&replyOK != 0 || rep.flags[0]&8 == 0 {
				t.Errorf("another domain's 3 hits, at least 2, beside 3 of the resource's 4: %+v, want refused by the global limit", rep)
			}
		}},
		{"mode checked, nk", func(t *testing.T, x *luaRig, k func(string) string) {
			if err := x.c.Set(context.Background(), k("a:lock"), "someone", time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			if rep := x.call(x.take(modeChecked, 1, 1), "", []string{k("a"), k("a:lock")}, five); rep.status != statusBusy {
				t.Errorf("mode checked on a locked key (KEYS[nk+1]): status %d, want busy", rep.status)
			}
			if rep := x.call(x.take(modeDecide, 1, 1), "", []string{k("a")}, five); rep.status != statusDone || rep.granted[0] != 1 {
				t.Errorf("mode decide on a locked key: %+v, want granted (no lock read)", rep)
			}
		}},
		{"mode prepare, lease, commit", func(t *testing.T, x *luaRig, k func(string) string) {
			keys := []string{k("a"), k("a:lock")}
			h := x.take(modePrepare, 3, 1)
			h.lease = 7000
			if rep := x.call(h, "tok", keys, five); rep.status != statusDone || rep.granted[0] != 3 {
				t.Errorf("prepare: %+v, want 3 predicted", rep)
			}
			if ms := x.pttl(k("a:lock")); x.exists(k("a")) || ms <= 0 || ms > 7000 {
				t.Errorf("after the prepare: state stored %v, lock's ttl %d ms; want no state, a lock of at most the lease 7000", x.exists(k("a")), ms)
			}
			if rep := x.call(x.take(modeCommit, 3, 1), "other", keys, five); rep.status != statusLost {
				t.Errorf("commit of another token: status %d, want lost", rep.status)
			}
			if rep := x.call(x.take(modeCommit, 3, 1), "tok", keys, five); rep.status != statusDone || rep.granted[0] != 3 {
				t.Errorf("commit: %+v, want 3 granted", rep)
			}
			if x.exists(k("a:lock")) || x.left(k("a"), five) != 2 {
				t.Error("after the commit: want the lock gone and 2 of 5 left")
			}
		}},
		{"mode abort", func(t *testing.T, x *luaRig, k func(string) string) {
			keys := []string{k("a"), k("a:lock")}
			x.call(x.take(modePrepare, 3, 1), "tok", keys, five)
			if rep := x.call(x.take(modeAbort, 3, 1), "tok", keys, five); rep.status != statusDone {
				t.Errorf("abort: %+v", rep)
			}
			if x.exists(k("a")) || x.exists(k("a:lock")) {
				t.Error("after the abort: want no state and no lock")
			}
		}},
		{"mode release", func(t *testing.T, x *luaRig, k func(string) string) {
			keys := []string{k("a"), k("a:lock")}
			x.call(x.take(modePrepare, 3, 1), "tok", keys, five)
			rel := header{mode: modeRelease, nk: 1}
			x.call(rel, "other", keys)
			if !x.exists(k("a:lock")) {
				t.Error("another token's release removed the lock")
			}
			x.call(rel, "tok", keys)
			if x.exists(k("a:lock")) {
				t.Error("the token's release left its lock")
			}
		}},
		{"mode seal, lease", func(t *testing.T, x *luaRig, k func(string) string) {
			keys := []string{k("a"), k("a:lock")}
			h := x.take(modePrepare, 3, 1)
			h.lease = 1000
			x.call(h, "tok", keys, five)
			seal := header{mode: modeSeal, lease: 60_000, nk: 1}
			if rep := x.call(seal, "other", keys); rep.status != statusLost {
				t.Errorf("seal of another token: status %d, want lost", rep.status)
			}
			if rep := x.call(seal, "tok", keys); rep.status != statusDone || x.pttl(k("a:lock")) <= 1000 {
				t.Errorf("seal: status %d, lock's ttl %d ms; want done, extended to the lease 60000", rep.status, x.pttl(k("a:lock")))
			}
		}},
		{"mode undo, entered", func(t *testing.T, x *luaRig, k func(string) string) {
			for _, entered := range []bool{false, true} {
				key := k(fmt.Sprint("a", entered))
				if rep := x.call(x.take(modeDecide, 3, 1), "", []string{key}, five); rep.flags[0]&replyBurst == 0 {
					t.Fatalf("a fresh pair's first grant: %+v, want it to enter its tier", rep)
				}
				undo := header{mode: modeUndo, now: x.now, maxTTL: 3_600_000, nk: 1,
					items: []headerItem{{key: 1, policy: 1, hits: 3, entered: entered}}}
				x.call(undo, "", []string{key}, five)
				// Given back, the pair is fresh: its state deleted once
				// the tier is left too.
				if x.exists(key) == entered {
					t.Errorf("undo, entered %v: state stored %v, want %v", entered, x.exists(key), !entered)
				}
				if got := x.left(key, five); got != 5 {
					t.Errorf("undo, entered %v: %d left of 5, want 5", entered, got)
				}
			}
		}},
		{"undo's newest", func(t *testing.T, x *luaRig, k func(string) string) {
			for _, newest := range []bool{false, true} {
				key := k(fmt.Sprint("a", newest))
				x.call(x.take(modeDecide, 3, 1), "", []string{key}, five)
				// An undo at an instant before the grant's (a caller's
				// clock gone back): only newest looks in the newest bucket.
				undo := header{mode: modeUndo, now: x.now - 10, maxTTL: 3_600_000, newest: newest, nk: 1,
					items: []headerItem{{key: 1, policy: 1, hits: 3}}}
				x.call(undo, "", []string{key}, five)
				if got, want := x.left(key, five), map[bool]int64{false: 2, true: 5}[newest]; got != want {
					t.Errorf("undo 10 µs before the grant, newest %v: %d left of 5, want %d", newest, got, want)
				}
			}
		}},
		{"flag refund", func(t *testing.T, x *luaRig, k func(string) string) {
			x.call(x.take(modeDecide, 3, 1), "", []string{k("a")}, five)
			h := x.take(modeDecide, 2, 0)
			h.items[0].refund, h.items[0].lead = true, 0
			x.call(h, "", []string{k("a")}, five)
			if got := x.left(k("a"), five); got != 4 {
				t.Errorf("3 hits, 2 refunded: %d left of 5, want 4", got)
			}
		}},
		{"flag shadow", func(t *testing.T, x *luaRig, k func(string) string) {
			x.call(x.take(modeDecide, 2, 2), "", []string{k("full")}, two)
			for _, shadow := range []bool{false, true} {
				a := k(fmt.Sprint("a", shadow))
				h := header{mode: modeDecide, now: x.now, maxTTL: 3_600_000, nk: 2, items: []headerItem{
					{key: 1, policy: 1, hits: 1, min: 1, lead: 1},
					{key: 2, policy: 2, hits: 1, min: 1, shadow: shadow, lead: 2},
				}}
				x.call(h, "", []string{a, k("full")}, five, two)
				// A shadow item's refusal refuses nothing: the other
				// item's grant is committed.
				if got, want := x.left(a, five), map[bool]int64{false: 5, true: 4}[shadow]; got != want {
					t.Errorf("beside a refused item, shadow %v: %d left of 5, want %d", shadow, got, want)
				}
			}
		}},
		{"plan: lead", func(t *testing.T, x *luaRig, k func(string) string) {
			for _, grouped := range []bool{false, true} {
				key := k(fmt.Sprint("a", grouped))
				h := header{mode: modeDecide, now: x.now, maxTTL: 3_600_000, nk: 1, items: []headerItem{
					{key: 1, policy: 1, hits: 3, min: 3, lead: 1},
					{key: 1, policy: 1, hits: 3, min: 3, lead: 2},
				}}
				if grouped {
					h.items[1].lead = 1
				}
				// One group asks for 6 of 5, at least 6: refused; two
				// groups are peeked one by one.
				if rep := x.call(h, "", []string{key}, five); (rep.flags[0]&replyOK != 0) == grouped {
					t.Errorf("two items of 3 on one key, one group %v: %+v", grouped, rep)
				}
			}
		}},
		{"plan: glob", func(t *testing.T, x *luaRig, k func(string) string) {
			for _, shared := range []bool{false, true} {
				g := k(fmt.Sprint("g", shared))
				h := header{mode: modeDecide, now: x.now, maxTTL: 3_600_000, nk: 3, items: []headerItem{
					{key: 1, global: 3, policy: 1, hits: 3, min: 1, lead: 1, glob: 1},
					{key: 2, global: 3, policy: 1, hits: 2, min: 2, lead: 2, glob: 2},
				}}
				if shared {
					h.items[1].glob = 1
				}
				// Sharing the global state with the first group, the
				// second group's room is the limit 4 less the first's 3:
				// refused before anything is committed, the call commits
				// nothing. Not sharing it, both are granted until the
				// first is committed.
				rep := x.call(h, "", []string{k(fmt.Sprint("a", shared)), k(fmt.Sprint("b", shared)), g}, global)
				if rep.flags[1]&replyOK != 0 || x.exists(g) == shared {
					t.Errorf("two groups on one global limit of 4, 3 and at least 2, sharing %v: %+v, global state stored %v; want the second refused, the global state %v",
						shared, rep, x.exists(g), !shared)
				}
			}
		}},
		{"off: a reservation, its give-back", func(t *testing.T, x *luaRig, k func(string) string) {
			x.call(x.take(modeDecide, 2, 2), "", []string{k("a")}, five)
			h := x.take(modeDecide, 3, 1)
			h.off = 500_000
			rep := x.call(h, "", []string{k("a")}, five)
			if rep.now != x.now+500_000 || rep.granted[0] != 3 {
				t.Errorf("a reservation 500 ms ahead: %+v, want 3 granted for %d", rep, x.now+500_000)
			}
			back := x.take(modeDecide, 3, 0)
			back.items[0].refund, back.items[0].lead, back.off = true, 0, -rep.now
			x.call(back, "", []string{k("a")}, five)
			if got := x.left(k("a"), five); got != 3 {
				t.Errorf("2 hits, and 3 reserved and given back: %d left of 5, want 3", got)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := &luaRig{t: t, c: c, now: time.Now().Add(time.Hour).UnixMicro()}
			tc.run(t, x, func(s string) string { return "hdr:" + tc.name + ":" + s })
		})
	}
}

// redisMicros returns Redis's TIME in µs.
func redisMicros(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	tm, err := c.Time(context.Background()).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	return tm.UnixMicro()
}
