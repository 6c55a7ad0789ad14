package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/tiers"
)

// Errors of the Redis store.
var (
	// ErrBusy is returned (wrapped) when a call's keys stayed locked by
	// two-step calls of other processes until the context ended or the
	// retries ran out. Nothing was changed.
	ErrBusy = errors.New("redisstore: keys locked by concurrent calls")
	// ErrLockLost is returned when a two-step call's locks expired before
	// it committed: the process stalled for more than the locks' lease
	// (sealFactor × LockTTL) between two round trips of one call. The call
	// may be committed in some slots and not in others.
	ErrLockLost = errors.New("redisstore: lock lost between the two steps")
)

// busyAgain is how many times a two-step call prepares again the slots it
// found busy, holding the locks it took, before it releases them all.
const busyAgain = 3

// sealFactor × LockTTL is the locks' lease: how long the locks of a two-step
// call live from its prepare, or from its seal.
const sealFactor = 10

// maxAttempts bounds the retries of a call that finds its keys locked.
const maxAttempts = 200

// Store is the Redis store. Safe for concurrent use; create it with
// NewWithClient.
type Store struct {
	c       redis.UniversalClient
	cluster bool
	// nodes is c as a Cluster client (nil otherwise): the dispatchers
	// send each master's calls as one FCALL (runNodes).
	nodes  *redis.ClusterClient
	prefix string
	caller bool // Clock == ClockCaller
	maxTTL int64
	lease  int64 // ms: the locks' life from a prepare or a seal (sealFactor × LockTTL)
	// sealAfter: a two-step call whose prepares took this long (LockTTL)
	// seals its locks before it commits.
	sealAfter time.Duration
	pols      policyCache
	closed    atomic.Bool
	calls     sync.Pool
	// The dispatchers (pipeline.go); q is nil when Options.Pipelines < 0.
	q    chan *request
	stop chan struct{}
	wg   sync.WaitGroup // the dispatchers
	rwg  sync.WaitGroup // the refunder
	// late counts the give-backs of the calls applied after their callers
	// gave up (giveBackLate); lost the calls whose callers gave up that
	// got no reply.
	late backCount
	lost atomic.Uint64
	// undone counts the give-backs of the slots of calls spanning Cluster
	// slots whose grants were given back because another slot rejected
	// or failed (oneTrip).
	undone backCount
	// refunds queues the late replies for the refunder, which gives them
	// back off the dispatchers' path (nil without dispatchers).
	refunds chan []lateReply
	// replies counts the calls the dispatchers sent whose replies came
	// back, their callers waiting or not.
	replies atomic.Uint64
	// byShard counts them per Cluster master (address → *atomic.Uint64).
	byShard sync.Map
	// busy is the work pending after its callers returned (Settle); bg
	// the goroutines of some of it (background), joined by Close.
	busy pending
	bg   joined
	// stall tells the calls not sent whether Redis' silence held them
	// (stuck.go).
	stall stuckWatch
}

// LateGrants reports how many calls Redis applied after their callers had
// given up (the failure mode decided for them), whose grants the store
// gave back, and how many of those refunds failed. Only the pipelined
// store (Options.Pipelines > 0) reads late replies.
func (s *Store) LateGrants() (givenBack, failed uint64) {
	return s.late.given.Load(), s.late.failed.Load()
}

// LateLost reports how many calls whose callers had given up got no reply:
// the dispatcher's wait for it ended (lateReplyWait past the latest
// deadline of its batch) or the connection failed. Applied or not, nothing
// was given back.
func (s *Store) LateLost() uint64 { return s.lost.Load() }

// Replies reports how many calls sent by the dispatchers Redis answered,
// those whose callers had given up included: evidence that Redis is up
// which the callers that timed out did not see. Only the pipelined store
// (Options.Pipelines > 0) counts them.
func (s *Store) Replies() uint64 { return s.replies.Load() }

var _ store.Store = (*Store)(nil)

// call is the scratch of one Decide.
type call struct {
	skey, gkey []string // per item: state key, global key ("": none)
	slot       []uint16 // per item: the slot of its keys
	enc        []*encoded
	plan       *store.Plan // the items' grouping: &own, or a two-step's call's
	own        store.Plan
	// per script call
	keys  []string
	kix   []int // per item: index of its state key in keys, -1 not in this call
	loc   []int // per item: its index among the items of this call (from 1), 0 not in it
	pols  []*encoded
	h     header // the command's, items reused
	hdr   []byte // h encoded
	hbox  any    // hdr boxed, reused while hdr keeps its array and length
	args  []any  // the FCALL command
	slots []uint16
	req   *request
	// A slot's call in a step of a two-step (slotCalls): its script's
	// status, the now it used (its prepare's, for its commit) and error.
	st   int
	used int64
	err  error
	// res is the reply to the last exec (its decisions are in out), which
	// a slot's give-back reads (oneTrip).
	res string
	// off is a reservation's offset in µs (Store.Reserve), 0 for none.
	off int64
}

// NewWithClient returns a Store over c, which the caller keeps and closes.
// A *redis.ClusterClient (or opts.Cluster) makes the store split calls by
// slot and use the two-step for calls spanning slots.
func NewWithClient(c redis.UniversalClient, opts Options) (*Store, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	cc, isCluster := c.(*redis.ClusterClient)
	s := &Store{
		c:         c,
		nodes:     cc,
		cluster:   isCluster || o.Cluster,
		prefix:    o.KeyPrefix,
		caller:    o.Clock == ClockCaller,
		maxTTL:    o.MaxTTL.Milliseconds(),
		lease:     max(1, (sealFactor * o.LockTTL).Milliseconds()),
		sealAfter: o.LockTTL,
	}
	s.calls.New = func() any { return new(call) }
	s.stop = make(chan struct{})
	pipelines := o.Pipelines
	if pipelines == 0 {
		pipelines = DefaultPipelines
		if s.cluster {
			pipelines = DefaultClusterPipelines
		}
	}
	if pipelines > 0 {
		s.q = make(chan *request, maxBatch*pipelines)
		s.refunds = make(chan []lateReply, refundQueue)
		s.stall.dispatchers = int32(pipelines)
		s.wg.Add(pipelines)
		s.rwg.Add(1)
		for range pipelines {
			go s.dispatch()
		}
		go s.refunder()
	}
	return s, nil
}

// Client returns the store's Redis client.
func (s *Store) Client() redis.UniversalClient { return s.c }

// Close implements store.Store: Decide fails with store.ErrClosed afterwards
// (calls waiting for a pipeline too, whose grants are given back as those
// of callers that gave up), the dispatchers stop once their batch in
// flight is answered, and the give-backs of the late replies read meanwhile
// are sent; Close returns once every give-back and release the store sent
// in the background is done, each within lateReplyWait (the caller closes
// the client afterwards; on a closed client they fail and are counted as
// failed). It returns nil.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	close(s.stop)
	s.wg.Wait()
	if s.refunds != nil {
		// No dispatcher is left to queue one: the refunder sends what
		// is queued, then returns.
		close(s.refunds)
	}
	s.rwg.Wait()
	s.joinBackground()
	return nil
}

// Decide implements store.Store with one script call (one round trip) when
// all the items' keys are in one Cluster slot (always on a single node or
// with Sentinel), with one script call per slot (and a give-back when a
// slot rejects: oneTrip) when the items' grants can be given back exactly,
// and with the two-step of the package documentation otherwise. With ClockRedis (the default) now is ignored and the script
// reads the Redis master's clock.
//
// On an error the call may or may not have been committed (a script that
// timed out on the client may have run); store.ErrBadItem is returned before
// anything is sent.
func (s *Store) Decide(ctx context.Context, now time.Time, items []store.Item, out []tiers.Decision) error {
	if err := store.CheckDecide(s.closed.Load(), items, out); err != nil || len(items) == 0 {
		return err
	}
	t := int64(-1)
	if s.caller {
		t = now.UnixMicro()
	}
	return s.decideAt(ctx, now, t, 0, items, out)
}

var _ store.Reserver = (*Store)(nil)

// Reserve implements store.Reserver: Decide for the instant now+after, in
// whole microseconds. The script reads its present as Decide does (the
// Redis master's clock, or now under ClockCaller) and is told the offset
// after the items (apply.lua's fdecide, tiers.lua's "Pacing"). On Redis's clock a call whose
// keys span Cluster slots is not reserved (store.ErrCannotReserve): each
// slot's script reads its own clock, so its items would be reserved for
// different instants.
func (s *Store) Reserve(ctx context.Context, now time.Time, after time.Duration, items []store.Item, out []tiers.Decision) (time.Time, error) {
	if err := store.CheckDecide(s.closed.Load(), items, out); err != nil || len(items) == 0 {
		return time.Time{}, err
	}
	off := max(after.Microseconds(), 1)
	if s.caller {
		t := now.UnixMicro()
		return time.UnixMicro(t + off), s.decideAt(ctx, now, t, off, items, out)
	}
	used, err := s.reserveRedis(ctx, now, off, items, out)
	return time.UnixMicro(used), err
}

// GiveBack implements store.Reserver: the items' refunds for the instant
// at (the script's offset is then -at µs: an instant, not an offset).
func (s *Store) GiveBack(ctx context.Context, now, at time.Time, items []store.Item) error {
	back, out := store.GiveBackItems(items)
	if err := store.CheckDecide(s.closed.Load(), back, out); err != nil || len(back) == 0 {
		return err
	}
	t := int64(-1)
	if s.caller {
		t = now.UnixMicro()
	}
	return s.decideAt(ctx, now, t, -at.UnixMicro(), back, out)
}

// reserveRedis is Reserve on Redis's clock: one script call, whose answer's
// instant is the one reserved for.
func (s *Store) reserveRedis(ctx context.Context, now time.Time, off int64, items []store.Item, out []tiers.Decision) (int64, error) {
	c := s.calls.Get().(*call)
	defer s.put(c)
	c.prepare(s, items, now)
	c.off = off
	if !c.oneSlot() {
		return 0, fmt.Errorf("redisstore: %w: keys in several Cluster slots on Redis's clock", store.ErrCannotReserve)
	}
	return s.inSlot(ctx, c, items, -1, out)
}

// decideAt is Decide at now (the policies' encoding instant) and t, the
// script's now (µs on the caller's clock, -1 for Redis's), reserving for
// off µs later when off > 0, giving back a reservation for the instant
// -off µs when off < 0.
func (s *Store) decideAt(ctx context.Context, now time.Time, t, off int64, items []store.Item, out []tiers.Decision) error {
	c := s.calls.Get().(*call)
	defer s.put(c)
	c.prepare(s, items, now)
	c.off = off
	if c.oneSlot() {
		_, err := s.inSlot(ctx, c, items, t, out)
		return err
	}
	// A reservation or its give-back (off != 0) takes the two-step: an undo
	// prunes at the instant it gives back at, which for a reservation is
	// later than the present.
	if off == 0 && undoable(items) {
		return s.oneTrip(ctx, c, items, t, out)
	}
	return s.twoStep(ctx, c, items, t, out)
}

// oneSlot reports whether the keys of c's items are in one Cluster slot
// (always on a single Redis).
func (c *call) oneSlot() bool {
	for _, sl := range c.slot {
		if sl != c.slot[0] {
			return false
		}
	}
	return true
}

// inSlot makes the call c of items, whose keys are in one slot, with one
// script call at t (-1: Redis's clock), sent again after wait's backoff
// while a key is locked by a two-step call (on a Cluster) or its slot is
// migrating (TRYAGAIN). It returns the instant the script used.
func (s *Store) inSlot(ctx context.Context, c *call, items []store.Item, t int64, out []tiers.Decision) (int64, error) {
	mode := modeDecide
	if s.cluster {
		mode = modeChecked
	}
	for attempt := 0; ; attempt++ {
		st, used, err := s.exec(ctx, c, items, -1, mode, t, "", out)
		if err == nil && st == statusDone {
			return used, nil
		}
		if err != nil && !isTryAgain(err) {
			return 0, err
		}
		if werr := wait(ctx, attempt); werr != nil {
			if err != nil {
				// TRYAGAIN until the deadline: the command never ran, as
				// for keys locked (a slot's move is invisible to callers).
				return 0, fmt.Errorf("%w (its slot was migrating)", werr)
			}
			return 0, werr
		}
	}
}

func (s *Store) put(c *call) {
	clear(c.skey)
	clear(c.gkey)
	clear(c.enc)
	clear(c.keys)
	clear(c.pols)
	clear(c.args)
	c.skey, c.gkey, c.enc, c.keys, c.pols, c.args = c.skey[:0], c.gkey[:0], c.enc[:0], c.keys[:0], c.pols[:0], c.args[:0]
	c.off, c.res = 0, ""
	c.plan = nil
	s.calls.Put(c)
}

// prepare computes the keys, slots and policy encodings of the items, and
// their plan.
func (c *call) prepare(s *Store, items []store.Item, now time.Time) {
	c.own.Make(items)
	c.plan = &c.own
	c.skey, c.gkey, c.slot, c.enc = c.skey[:0], c.gkey[:0], c.slot[:0], c.enc[:0]
	for i := range items {
		it := &items[i]
		sk, gk := stateKey(s.prefix, it)
		c.skey = append(c.skey, sk)
		c.gkey = append(c.gkey, gk)
		var sl uint16
		if s.cluster {
			sl = slot(sk)
		}
		c.slot = append(c.slot, sl)
		c.enc = append(c.enc, s.pols.get(it.Policy, now))
	}
}

// exec runs the script once for the items of slot sel (-1: all items) and,
// when it answers, writes their decisions to out. It returns the script's
// status and the now (µs) it used.
func (s *Store) exec(ctx context.Context, c *call, items []store.Item, sel int, mode int, now int64, token string, out []tiers.Decision) (int, int64, error) {
	c.command(s, items, sel, mode, now, token)
	res, err := s.fcall(ctx, c)
	c.res = res
	if err != nil {
		return 0, 0, err
	}
	if mode == modeSeal || mode == modeRelease {
		// The reply is a status, with no decisions.
		r := reader{b: res}
		st := r.num()
		if r.err != nil {
			return 0, 0, errReply
		}
		return int(st), 0, nil
	}
	return c.read(res, items, out)
}

// command sets c.args to the FCALL of the decide function for the items
// of slot sel (-1: all items) in mode, and c.h to its header.
func (c *call) command(s *Store, items []store.Item, sel int, mode int, now int64, token string) {
	c.keys, c.pols = c.keys[:0], c.pols[:0]
	c.kix, c.loc = c.kix[:0], c.loc[:0]
	c.h = header{mode: int64(mode), now: now, maxTTL: s.maxTTL, lease: s.lease, items: c.h.items[:0], off: c.off}
	for i := range items {
		if sel >= 0 && int(c.slot[i]) != sel {
			c.loc = append(c.loc, 0)
			c.kix = append(c.kix, -1)
			continue
		}
		it := &items[i]
		c.loc = append(c.loc, len(c.h.items)+1)
		k := c.keyIndex(c.skey[i])
		c.kix = append(c.kix, k)
		hi := headerItem{key: k + 1, hits: it.Hits, min: itemMin(it), refund: it.Refund, shadow: it.Shadow}
		if c.gkey[i] != "" {
			hi.global = c.keyIndex(c.gkey[i]) + 1
		}
		hi.policy = slices.Index(c.pols, c.enc[i]) + 1
		if hi.policy == 0 {
			c.pols = append(c.pols, c.enc[i])
			hi.policy = len(c.pols)
		}
		// The plan, for the general code: a group's items, and the groups
		// sharing a global state, share a slot (keys.go), so every leader
		// of the call's items is one of them, and comes first.
		if l := c.plan.Leader(i); l >= 0 {
			hi.lead = c.loc[l]
		}
		if g := c.plan.Global(i); g >= 0 {
			hi.glob = c.loc[g]
		}
		c.h.items = append(c.h.items, hi)
	}
	c.h.nk = len(c.keys)
	if mode != modeDecide {
		for k := range c.h.nk {
			c.keys = append(c.keys, lockKey(s.prefix, c.keys[k]))
		}
	}
	c.hdr = c.h.append(c.hdr[:0])
	// Boxing a []byte allocates: the box of the last header is reused when
	// this one has the same array and length (its bytes were rewritten in
	// place; go-redis has written the previous command before returning).
	h := c.hdr
	if b, ok := c.hbox.([]byte); !ok || len(b) != len(h) || &b[0] != &h[0] {
		c.hbox = h
	}
	c.args = append(c.args[:0], fcallName, funcNameArg, len(c.keys))
	for _, k := range c.keys {
		c.args = append(c.args, k)
	}
	c.args = append(c.args, c.hbox, token)
	for _, e := range c.pols {
		c.args = append(c.args, e.arg)
	}
}

func (c *call) keyIndex(k string) int {
	for j, x := range c.keys {
		if x == k {
			return j
		}
	}
	c.keys = append(c.keys, k)
	return len(c.keys) - 1
}

// read decodes a reply for the items of the last exec.
func (c *call) read(res string, items []store.Item, out []tiers.Decision) (int, int64, error) {
	r := reader{b: res}
	st := r.num()
	used := r.num()
	if r.err != nil {
		return 0, 0, errReply
	}
	if st != statusDone {
		return int(st), used, nil
	}
	for i := range items {
		if c.kix[i] < 0 {
			continue
		}
		out[i] = decision(items[i].Policy, &r)
		stampSlots(items[i].Policy, &out[i], used)
	}
	if r.err != nil {
		return 0, 0, r.err
	}
	return statusDone, used, nil
}

// isTryAgain reports whether err is Redis Cluster's TRYAGAIN: a command of
// several keys of a slot being migrated, some moved and some not, which
// did not run. go-redis retries it a few times; a slot that takes longer to
// move (a busy machine) would otherwise fail a call whose caller allows the
// time, so the store retries it as it does a busy key.
func isTryAgain(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && strings.HasPrefix(re.Error(), "TRYAGAIN")
}

// wait sleeps before retry attempt+1 of a call that found its keys locked,
// from 50µs doubling to about 5ms, with jitter.
func wait(ctx context.Context, attempt int) error {
	if attempt >= maxAttempts {
		return ErrBusy
	}
	d := 50 * time.Microsecond << min(attempt, 7)
	d = d/2 + time.Duration(mrand.Int64N(int64(d)))
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", ErrBusy, ctx.Err())
	case <-tm.C:
		return nil
	}
}

// twoStep decides a call whose keys span Cluster slots, all or nothing:
//
//  1. Prepare, one script per slot: if any of the slot's keys is locked,
//     answer busy and do nothing; else lock every key of the slot (a lock
//     key with a random token and a PX of the lease, sealFactor × LockTTL)
//     and answer the predictions of store.Apply's steps 1 and 2 for the
//     slot's items, writing nothing (refunds included).
//  2. If a slot was busy: prepare it again after a short wait, up to
//     busyAgain times, keeping the locks taken; then release them all,
//     wait and start again.
//     Otherwise, if no slot predicted a rejected non-shadow group, commit
//     every slot. The prepares' answers came within LockTTL of their
//     sending, so every lock has at least the lease less LockTTL to live
//     when the commits are sent. When they took longer (a slow machine, a
//     long pause), seal every slot first: the token must still hold each
//     lock, which is extended to the lease; a lock that lapsed releases
//     them all and starts again, with nothing written. If a group was
//     rejected, abort every slot: the script checks its token still holds
//     the locks, applies the refunds, commits the groups (commit) or not
//     (abort), writes the keys, and releases the locks.
//
// Each step sends its scripts for all the slots at once (slotCalls) and
// waits for every answer before the next step, so a call holds its locks
// for two round trips whatever the number of slots.
//
// While a call holds a key's lock, every other call touching the key (one-
// step calls included, in Cluster mode) answers busy and retries, so the
// state that step 1 saw is the state step 2 commits on: the answer is the
// one store.Apply gives over all the items. Groups sharing a state or a
// global state are always in one slot (key layout), so the slots only meet
// in the all-or-nothing. Each slot decides at the now of its own prepare.
func (s *Store) twoStep(ctx context.Context, c *call, items []store.Item, now int64, out []tiers.Decision) error {
	var tb [16]byte
	_, _ = rand.Read(tb[:8])
	token := hex.EncodeToString(tb[:8])
	sc := s.slotCalls(c)
	defer sc.done(s)
	bg := context.WithoutCancel(ctx)
	for attempt := 0; ; attempt++ {
		sent := time.Now()
		sc.run(func(k int, sub *call) {
			sub.st, sub.used, sub.err = s.exec(ctx, sub, items, int(c.slots[k]), modePrepare, now, token, out)
		})
		busy, err := sc.prepared()
		// A slot found busy is most often a hot key that another call
		// holds for a round trip or two: prepare it again a few times,
		// keeping the locks taken (keys of one call, rarely wanted by
		// another), before releasing them all and starting again.
		for again := 0; err == nil && busy && again < busyAgain; again++ {
			if err = wait(ctx, again); err != nil {
				break
			}
			sc.run(func(k int, sub *call) {
				if sub.err == nil && sub.st == statusBusy {
					sub.st, sub.used, sub.err = s.exec(ctx, sub, items, int(c.slots[k]), modePrepare, now, token, out)
				}
			})
			busy, err = sc.prepared()
		}
		prepared := time.Since(sent)
		if err != nil && !isTryAgain(err) {
			// The call fails: release what its prepares may have locked
			// without holding up its caller, whose deadline may be what
			// failed it (a node that stopped answering would hold the
			// release as long as the lateReplyWait it is given).
			s.releaseLater(sc, token)
			return err
		}
		if err != nil || busy {
			// Release the slots that locked, and those whose prepare failed:
			// it may have run (a caller that gave up after it was sent), and
			// its locks would stay for the whole lease. A release removes
			// only the locks of this call's token; it gets lateReplyWait, as
			// a late reply does.
			rel, cancel := context.WithTimeout(bg, lateReplyWait)
			sc.run(func(k int, sub *call) {
				if sub.err != nil || sub.st == statusDone {
					_, _, _ = s.exec(rel, sub, items, int(c.slots[k]), modeRelease, now, token, out)
				}
			})
			cancel()
			if err != nil && !isTryAgain(err) {
				return err
			}
			if werr := wait(ctx, attempt); werr != nil {
				if err != nil {
					return err
				}
				return werr
			}
			continue
		}
		commit := !rejected(c, out, -1)
		mode := modeAbort
		if commit && prepared >= s.sealAfter {
			// Fencing after slow prepares: commit only if the token still
			// holds every lock, checked in every slot before any slot
			// commits, and with the locks extended to the lease. A lock
			// that lapsed since its prepare means another call may have
			// decided on those keys: nothing was written yet, so release
			// the rest and start again.
			sc.run(func(k int, sub *call) {
				var st int
				st, _, sub.err = s.exec(bg, sub, items, int(c.slots[k]), modeSeal, now, token, out)
				if sub.err == nil && st != statusDone {
					sub.err = ErrLockLost
				}
			})
			sealed := true
			for _, sub := range sc.subs {
				sealed = sealed && sub.err == nil
			}
			if !sealed {
				sc.run(func(k int, sub *call) {
					_, _, _ = s.exec(bg, sub, items, int(c.slots[k]), modeRelease, now, token, out)
				})
				if err := wait(ctx, attempt); err != nil {
					return err
				}
				continue
			}
		}
		if commit {
			mode = modeCommit
		}
		sc.run(func(k int, sub *call) {
			var st int
			for a := 0; ; a++ {
				// A commit or abort that met TRYAGAIN did not run: its
				// locks still hold the keys, so it can go again.
				// A reservation's script answers its decision instant, the
				// present plus off (or -off): the commit sends back the
				// present, which on the caller's clock is now.
				used := sub.used
				if sub.off != 0 {
					used = now
				}
				st, _, sub.err = s.exec(bg, sub, items, int(c.slots[k]), mode, used, token, out)
				if !isTryAgain(sub.err) || wait(bg, a) != nil {
					break
				}
			}
			if sub.err == nil && st == statusLost {
				sub.err = ErrLockLost
			}
		})
		for _, sub := range sc.subs {
			if sub.err != nil {
				return sub.err
			}
		}
		return nil
	}
}

// releaseLater sends, in the background and within lateReplyWait, the
// release of token's locks in every slot of sc whose prepare failed (it may
// have run) or locked. It copies what it sends: sc goes back to the pool.
func (s *Store) releaseLater(sc *slotCalls, token string) {
	var cmds [][]any
	for _, sub := range sc.subs {
		if (sub.err == nil && sub.st != statusDone) || len(sub.keys) == 0 || len(sub.keys)%2 != 0 {
			continue
		}
		// A prepare's keys are its slot's keys, then their locks.
		h := header{mode: modeRelease, nk: len(sub.keys) / 2}
		hdr := h.append(nil)
		args := []any{fcallName, funcNameArg, len(sub.keys)}
		for _, k := range sub.keys {
			args = append(args, k)
		}
		cmds = append(cmds, append(args, hdr, token))
	}
	if len(cmds) == 0 {
		return
	}
	s.background(func() {
		ctx, cancel := context.WithTimeout(context.Background(), lateReplyWait)
		defer cancel()
		pipe := s.c.Pipeline()
		for _, args := range cmds {
			_ = pipe.Do(ctx, args...)
		}
		_, _ = pipe.Exec(ctx)
	})
}

// slotCalls holds one call per slot of a call c spanning slots (oneTrip,
// twoStep), for the scripts a step sends to all the slots at once: each
// has buffers of its own and shares c's per-item keys, slots and policies
// (read only while it runs).
type slotCalls struct {
	subs []*call
	wg   sync.WaitGroup
}

// slotCalls sets c.slots to the slots of c's items, in order, and returns
// a call for each.
func (s *Store) slotCalls(c *call) *slotCalls {
	c.slots = c.slots[:0]
	for _, sl := range c.slot {
		if !slices.Contains(c.slots, sl) {
			c.slots = append(c.slots, sl)
		}
	}
	slices.Sort(c.slots)
	sc := &slotCalls{subs: make([]*call, len(c.slots))}
	for k := range sc.subs {
		sub := s.calls.Get().(*call)
		sub.skey, sub.gkey, sub.slot, sub.enc, sub.plan, sub.off = c.skey, c.gkey, c.slot, c.enc, c.plan, c.off
		sc.subs[k] = sub
	}
	return sc
}

// run calls f for every slot at once, the first in this goroutine, and
// returns when all have returned. Each f writes only its own call and the
// decisions of its slot's items.
func (sc *slotCalls) run(f func(k int, sub *call)) {
	for k := 1; k < len(sc.subs); k++ {
		sc.wg.Add(1)
		go func() {
			defer sc.wg.Done()
			f(k, sc.subs[k])
		}()
	}
	f(0, sc.subs[0])
	sc.wg.Wait()
}

// prepared returns whether a slot's prepare found its keys locked, and the
// first error of the slots' prepares.
func (sc *slotCalls) prepared() (busy bool, err error) {
	for _, sub := range sc.subs {
		if sub.err != nil && err == nil {
			err = sub.err
		}
		busy = busy || (sub.err == nil && sub.st == statusBusy)
	}
	return busy, err
}

// done gives the calls back, without the per-item slices they share.
func (sc *slotCalls) done(s *Store) {
	for _, sub := range sc.subs {
		sub.skey, sub.gkey, sub.slot, sub.enc, sub.plan = nil, nil, nil, nil, nil
		sub.st, sub.used, sub.err = 0, 0, nil
		s.put(sub)
	}
}
