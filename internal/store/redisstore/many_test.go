package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/charonlimit/charon/tiers"
)

// TestManyPath demands of the path for several one-tier items (many in
// decide.lua) the same answers, stored states and expiry times as the
// general decision: the library is loaded a second time with that path cut
// off, and random calls of two to four items (mostly one-tier policies on
// distinct keys; sometimes a shared key, a refund, a shadow item, another
// kind of policy, or an item that cannot be granted) go to both, each on
// keys of its own.
func TestManyPath(t *testing.T) {
	_, c := singleClient(t)
	ctx := context.Background()
	const cut = "if n > 1 and mode <= 2 then"
	if !strings.Contains(decideLua, cut) {
		t.Fatal("decide.lua has no many path to cut off")
	}
	ref := strings.Replace(decideLua, cut, "if false then", 1)
	refVersion := libHash(ref)
	for _, code := range []string{libraryCode, strings.ReplaceAll(ref, "@V@", refVersion)} {
		if err := c.FunctionLoadReplace(ctx, code).Err(); err != nil {
			t.Fatal(err)
		}
	}
	fns := []string{funcName, "charon_decide_" + refVersion}
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
		}
		q, _ := tiers.Normalize(*p)
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
			var h []byte
			for _, v := range []int64{modeDecide, now, 3_600_000, 1000, int64(n), int64(n)} {
				h = appendF64(h, v)
			}
			for i := range n {
				sk := int64(i + 1)
				if r.IntN(15) == 0 {
					sk = 1 // a shared key: the general path groups them
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
				for _, v := range []int64{sk, 0, int64(i + 1), hits, hits, f} {
					h = appendF64(h, v)
				}
			}
			var replies []string
			var states [2][]string
			var expiry [2][]int64
			for k, fn := range fns {
				args := []any{"fcall", fn, n}
				for i := range n {
					args = append(args, fmt.Sprintf("many:%d:%d:%d", k, trace, i))
				}
				args = append(args, string(h), "")
				for _, p := range pols {
					args = append(args, encodePolicy(p).arg)
				}
				rep, err := c.Do(ctx, args...).Text()
				if err != nil {
					t.Fatalf("trace %d step %d: %s: %v", trace, step, fn, err)
				}
				replies = append(replies, rep)
				for i := range n {
					key := fmt.Sprintf("many:%d:%d:%d", k, trace, i)
					st, _ := c.Get(ctx, key).Result()
					exp, err := c.Do(ctx, "pexpiretime", key).Int64()
					if err != nil {
						t.Fatal(err)
					}
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

// TestManyCost measures what the many path saves Redis on a call of three
// one-tier items on distinct keys ({user}, {tenant}, {api, user} of Envoy
// descriptors), all granted: the library with and without the path take
// turns, ABBA, for CHARON_COST_ROUNDS rounds of 2,000 calls over 10,000
// users, and Redis' own time per FCALL (INFO commandstats) is logged for
// each. It runs only when CHARON_COST_ROUNDS is set.
func TestManyCost(t *testing.T) {
	rounds, _ := strconv.Atoi(os.Getenv("CHARON_COST_ROUNDS"))
	if rounds <= 0 {
		t.Skip("set CHARON_COST_ROUNDS to measure")
	}
	n, c := singleClient(t)
	ctx := context.Background()
	ref := strings.Replace(decideLua, "if n > 1 and mode <= 2 then", "if false then", 1)
	refVersion := libHash(ref)
	for _, code := range []string{libraryCode, strings.ReplaceAll(ref, "@V@", refVersion)} {
		if err := c.FunctionLoadReplace(ctx, code).Err(); err != nil {
			t.Fatal(err)
		}
	}
	fns := []string{funcName, "charon_decide_" + refVersion}
	one := func(limit int64) any {
		return encodePolicy(&tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: limit, Window: time.Second, Active: tiers.Unbounded}}}).arg
	}
	pols := []any{one(1000), one(10000), one(100)}
	var h []byte
	for _, v := range []int64{modeDecide, -1, 3_600_000, 1000, 3, 3} {
		h = appendF64(h, v)
	}
	for i := range int64(3) {
		for _, v := range []int64{i + 1, 0, i + 1, 1, 1, 0} {
			h = appendF64(h, v)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	var sums [2]float64
	for round := range rounds {
		for _, k := range [][]int{{0, 1}, {1, 0}}[round%2] {
			if err := c.ConfigResetStat(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			for range 2000 {
				u := r.IntN(10000)
				args := []any{"fcall", fns[k], 3, fmt.Sprintf("m%d:u%d", k, u), fmt.Sprintf("m%d:t%d", k, u/100),
					fmt.Sprintf("m%d:a%d:u%d", k, r.IntN(10), u), string(h), ""}
				if err := c.Do(ctx, append(args, pols...)...).Err(); err != nil {
					t.Fatal(err)
				}
			}
			us, ok := fcallMicros(n.Port)
			if !ok {
				t.Fatal("no FCALL in INFO commandstats")
			}
			sums[k] += us
		}
	}
	t.Logf("Redis µs per FCALL of three items over %d rounds: with the many path %.1f, without %.1f (%.0f%% less)",
		rounds, sums[0]/float64(rounds), sums[1]/float64(rounds), 100*(1-sums[0]/sums[1]))
}
