package redisstore

import (
	"context"
	"slices"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/charonlimit/charon/internal/redisfunc"
)

// A grant Redis made that its caller does not keep is given back through
// one path: backFor makes the FCALL that gives it back from what the call
// sent (its command, kept with the encodings of its policies) and what
// Redis answered, and sendBack sends such FCALLs. Three occasions use it:
//
//   - A late reply: the call's caller gave up after it was sent (its
//     context ended, Release, Close). The dispatcher still reads the reply,
//     and the refunder gives back every grant of it (backLate), counted by
//     LateGrants.
//   - A call spanning Cluster slots (oneTrip) that a slot rejected: before
//     the call answers, the slots that granted give back what store.Apply
//     commits only when no group is rejected (backRejected), counted by
//     Undone.
//   - Such a call that failed (a slot's error): the slots that answered give
//     back every grant in the background (backLate), counted by Undone.
//
// A decision whose given-back groups can all be undone exactly
// (undoableTake: a fixed window, a plain rate_limit) is given back with the
// undo (mode undo, apply.lua's undo): each group's grant taken back from
// where it went, the count of its own fixed window, the bucket of a tier's
// logs that starts where the call's instant's bucket starts, so that the
// calls applied since keep their hits. That is exact on Redis's clock,
// which does not go back on a master, and on a caller's clock as long as it
// does not go back across a bucket's start between the calls on a key (a
// grant then joins a newer bucket, whose hits stay counted until they leave
// the window: only ever less granted). Any other decision is refunded at
// its instant (tiers.Refund: the newest hits of the current tier, whichever
// call added them). A reservation is given back as the engine gives back a
// wait its caller left: Store.GiveBack's call of store.Reserved (its grants
// as refunds, for the instant it answered), the same FCALL byte for byte.

// backWhy says which grants of a call are given back.
type backWhy int

const (
	// backLate: the caller was told nothing of the call; every grant.
	backLate backWhy = iota
	// backRejected: the caller was told its call (spanning slots) was
	// rejected; the grants store.Apply commits only when nothing is
	// rejected, not the post-paid groups' debits, committed anyway.
	backRejected
)

// backFor returns the FCALL that gives back what the call args, an FCALL
// of the decide function as call.command makes it (pols: the encodings of
// its policies, in order), was granted by res, Redis' reply to it; nil when
// there is nothing to give back: a call that is not a decision (the
// two-step's modes, an undo), that met a lock (status busy), that holds
// nothing but refunds (a reservation's give-back: applied, as asked), that
// was rejected (store.Apply then commits nothing but its post-paid groups'
// debits: giving back its other items' predictions would take away hits of
// other calls; the debits stay counted, only ever less granted), or that
// was granted nothing. newest tells an undo that no call on the keys came
// between the grants and it (header.newest). The refunds a call holds are
// not given back: they were applied, as asked.
func backFor(args []any, pols []*encoded, res string, why backWhy, newest bool) []any {
	if len(args) < 5 {
		return nil
	}
	nargs, ok := args[2].(int)
	if !ok || len(args) != 5+nargs+len(pols) {
		return nil
	}
	hb, ok := args[3+nargs].([]byte)
	if !ok {
		return nil
	}
	h, err := parseHeader(hb)
	if err != nil || (h.mode != modeDecide && h.mode != modeChecked) || h.off < 0 {
		return nil
	}
	locks := h.mode != modeDecide
	if want := h.nk; (locks && nargs != 2*want) || (!locks && nargs != want) {
		return nil
	}
	st, at, g, err := readGrants(res, len(h.items))
	if err != nil || st != statusDone {
		return nil
	}
	for i, it := range h.items {
		if it.policy > len(pols) {
			return nil
		}
		if it.lead == i+1 && !g[i].ok && !it.shadow {
			return nil // rejected
		}
	}
	// The groups given back, at their leaders: the sum of their members'
	// grants.
	sum := make([]int64, len(h.items))
	back := make([]bool, len(h.items))
	exact := h.off == 0
	for i, it := range h.items {
		if it.lead > 0 {
			sum[it.lead-1] += g[i].granted
		}
	}
	for i, it := range h.items {
		back[i] = it.lead == i+1 && g[i].ok && (why == backLate || !pols[it.policy-1].postPaid) && (sum[i] > 0 || g[i].burst)
		exact = exact && (!back[i] || pols[it.policy-1].undo)
	}
	// The give-back's keys and policies: those of the items it names, in
	// their order, each once (as call.command numbers them).
	var keys, pix []int
	key := func(k int) int { return number(&keys, k) }
	pol := func(p int) int { return number(&pix, p) }
	var out header
	if exact {
		// Not the newest bucket unless told, even on a caller's clock: calls
		// on the same keys may have been applied since.
		out = header{mode: modeUndo, now: at, maxTTL: h.maxTTL, newest: newest}
		for i, it := range h.items {
			if back[i] {
				out.items = append(out.items, headerItem{key: key(it.key), policy: pol(it.policy), hits: sum[i], entered: g[i].burst})
			}
		}
		locks = false
	} else {
		// Refunds belong to no group: the plan of refunds is all zeros.
		out = header{mode: h.mode, now: at, maxTTL: h.maxTTL, lease: h.lease}
		if h.off > 0 {
			out.now, out.off = h.now, -at
		}
		for i, it := range h.items {
			if it.refund || it.lead == 0 || !back[it.lead-1] || g[i].granted == 0 {
				continue
			}
			bi := headerItem{key: key(it.key), hits: g[i].granted, refund: true}
			if it.global > 0 {
				bi.global = key(it.global)
			}
			bi.policy = pol(it.policy)
			out.items = append(out.items, bi)
		}
	}
	if len(out.items) == 0 {
		return nil
	}
	out.nk = len(keys)
	cmd := append(make([]any, 0, 5+2*len(keys)+len(pix)), fcallName, funcNameArg, 0)
	for _, k := range keys {
		cmd = append(cmd, args[2+k])
	}
	if locks {
		for _, k := range keys {
			cmd = append(cmd, args[2+h.nk+k])
		}
	}
	cmd[2] = len(cmd) - 3
	cmd = append(cmd, out.append(nil), "")
	for _, p := range pix {
		cmd = append(cmd, pols[p-1].arg)
	}
	return cmd
}

// number returns x's number in *list (from 1), appending it when it is not
// there yet.
func number(list *[]int, x int) int {
	if j := slices.Index(*list, x); j >= 0 {
		return j + 1
	}
	*list = append(*list, x)
	return len(*list)
}

// backCount counts give-backs: those applied, and those that failed (the
// hits stay counted until they leave their window: only ever less
// granted).
type backCount struct{ given, failed atomic.Uint64 }

func (n *backCount) add(given, failed int) {
	if n != nil {
		n.given.Add(uint64(given))
		n.failed.Add(uint64(failed))
	}
}

// sendBack sends the FCALLs cmds (give-backs, or a two-step's releases) in
// one pipeline and counts in n (nil: nowhere) those applied and those that
// failed. One that found a key locked (on a Cluster, by another process's
// two-step call: mode checked answers busy and writes nothing) or met a
// slot being migrated (TRYAGAIN, which did not run) is sent again after
// wait's backoff, as Decide retries its own calls, until it is applied,
// fails otherwise, or ctx or the attempts run out. A master that lost the
// library (restarted empty) gets it again once, as fcall's calls do.
func (s *Store) sendBack(ctx context.Context, cmds [][]any, n *backCount) {
	given, failed := 0, 0
	load := 0 // the library: 0 not loaded here, 1 loaded, -1 failed to load
	for attempt := 0; len(cmds) > 0; attempt++ {
		pipe := s.c.Pipeline()
		sent := make([]*redis.Cmd, len(cmds))
		for i, args := range cmds {
			sent[i] = redis.NewCmd(ctx, args...)
			_ = pipe.Process(ctx, sent[i])
		}
		_, _ = pipe.Exec(ctx)
		var again [][]any
		for i, cmd := range sent {
			res, err := cmd.Text()
			var st int64 = -1
			if err == nil {
				r := reader{b: res}
				if st = r.num(); r.err != nil {
					st = -1
				}
			}
			switch {
			case st == statusDone:
				given++
			case st == statusBusy || isTryAgain(err):
				again = append(again, cmds[i])
			case redisfunc.IsNotFound(err) && load >= 0:
				if load == 0 {
					load = -1
					if lib.Load(ctx, s.c) == nil {
						load = 1
					}
				}
				if load < 0 {
					failed++
					break
				}
				again = append(again, cmds[i])
			default:
				failed++
			}
		}
		if len(again) > 0 && wait(ctx, attempt) != nil {
			failed += len(again)
			break
		}
		cmds = again
	}
	n.add(given, failed)
}

// lateReply is a reply read after its call's caller gave up: the call as
// sent, the encodings of its policies, the reply.
type lateReply struct {
	args []any
	pols []*encoded
	res  string
}

// giveBackLate gives back what the late replies granted (backLate), within
// lateReplyWait; LateGrants counts them.
func (s *Store) giveBackLate(late []lateReply) {
	var cmds [][]any
	for _, l := range late {
		if cmd := backFor(l.args, l.pols, l.res, backLate, false); cmd != nil {
			cmds = append(cmds, cmd)
		}
	}
	if len(cmds) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), lateReplyWait)
	defer cancel()
	s.sendBack(ctx, cmds, &s.late)
}
