package redisstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/charonlimit/charon/internal/redisfunc"
	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/tiers"
)

// maxBatch caps the FCALLs of one pipeline.
const maxBatch = 128

// The defaults of Options.Pipelines. On a single Redis one dispatcher
// makes the larger batches, each one FCALL of the batch function: with
// three fixed windows per request at 16 requests in flight, 5 to 9% less
// of Redis' CPU per request than two dispatchers and 2 to 5% more
// throughput. On a Cluster each batch is a pipeline split by node.
const (
	DefaultPipelines        = 1
	DefaultClusterPipelines = 2
)

// request is one FCALL handed to a dispatcher: args is the command, ctx
// the caller's (its deadline bounds the batch); the dispatcher writes res
// and err, then signals done (buffered: a caller that gave up does not
// block it).
type request struct {
	args []any
	ctx  context.Context
	res  string
	err  error
	done chan struct{}
	// undo: every take item of the call can be given back exactly
	// (call.undo), which a late reply's compensation does.
	undo bool
	// resv: the call is a reservation whose caller gave up after it was
	// sent; its late reply is given back from these (reservedBack).
	resv *reservation
	// state decides, once per send, between the dispatcher sending the
	// FCALL (reqSent) and its caller giving up first (reqAbandoned).
	state atomic.Int32
}

const (
	reqQueued int32 = iota
	reqSent
	reqAbandoned
	reqAnswered
)

// lateReplyWait is how long a dispatcher waits for the replies of a batch
// beyond its callers' deadlines, so that a call whose caller gave up after
// it was sent is still read, and what it granted given back (compensate).
const lateReplyWait = time.Second

// send hands the FCALL c.args to a dispatcher and waits for its reply,
// the caller's context, Release or Close. A caller that stops waiting
// detaches its request and the buffers the command points into (c.args,
// c.hdr), so that c can be reused while the dispatcher still sends them.
func (s *Store) send(ctx context.Context, c *call) (string, error) {
	r := c.req
	if r == nil {
		r = &request{done: make(chan struct{}, 1)}
		c.req = r
	}
	r.args, r.ctx, r.undo = c.args, ctx, true
	for _, e := range c.pols {
		r.undo = r.undo && e.undo
	}
	r.state.Store(reqQueued)
	mark, rel := s.stall.mark(), s.stall.released()
	select {
	case s.q <- r:
	case <-ctx.Done():
		r.args, r.ctx = nil, nil
		return "", s.notSent(ctx.Err(), mark)
	case <-rel:
		r.args, r.ctx = nil, nil
		return "", s.notSent(store.ErrReleased, mark)
	case <-s.stop:
		r.args, r.ctx = nil, nil
		return "", store.ErrClosed
	}
	var cause error
	select {
	case <-r.done:
		res, err := r.res, r.err
		r.args, r.ctx, r.res, r.err = nil, nil, "", nil
		return res, err
	case <-ctx.Done():
		cause = ctx.Err()
	case <-rel:
		cause = store.ErrReleased
	case <-s.stop:
		c.detach()
		return "", store.ErrClosed
	}
	if r.state.CompareAndSwap(reqQueued, reqAbandoned) {
		// Still in the queue: the dispatcher will not send it.
		c.detach()
		return "", s.notSent(cause, mark)
	}
	if c.off > 0 && c.items != nil {
		// A reservation: its late reply is given back from its items,
		// copied before the dispatcher can see the call abandoned.
		r.resv = &reservation{items: slices.Clone(c.items), now: c.now}
	}
	if r.state.CompareAndSwap(reqSent, reqAbandoned) {
		// Sent: if it is applied, the dispatcher gives back what it
		// granted when its reply comes (compensate).
		c.detach()
		return "", fmt.Errorf("redisstore: %w", cause)
	}
	r.resv = nil
	// Answered as the caller gave up: the answer stands.
	<-r.done
	res, err := r.res, r.err
	r.args, r.ctx, r.res, r.err = nil, nil, "", nil
	return res, err
}

// detach leaves c's request and command buffers to the dispatcher.
func (c *call) detach() {
	c.req, c.args, c.hdr, c.hbox = nil, nil, nil, nil
}

// dispatch is a dispatcher: it takes the requests queued while its last
// batch was in flight (up to maxBatch; no timer: a lone request goes at
// once), sends them as one pipeline of FCALLs (each still its own atomic
// function call) and answers each caller. It returns after Close.
func (s *Store) dispatch() {
	defer s.wg.Done()
	var d dispatcher
	for {
		select {
		case r := <-s.q:
			d.batch = append(d.batch[:0], r)
		case <-s.stop:
			return
		}
	fill:
		for len(d.batch) < maxBatch {
			select {
			case r := <-s.q:
				d.batch = append(d.batch, r)
			default:
				break fill
			}
		}
		s.stall.begin()
		s.run(&d)
		s.stall.end()
		for _, r := range d.batch {
			r.done <- struct{}{}
		}
		clear(d.batch)
		clear(d.cmds)
		clear(d.args)
	}
}

// dispatcher is a dispatcher's batch and the buffers it reuses: sent[i]
// tells whether batch[i] was sent, cmds[i] is its command in a pipeline of
// FCALLs, args and hdr the command and ARGV[1] of a batch call.
type dispatcher struct {
	batch []*request
	sent  []bool
	cmds  []*redis.Cmd
	retry []int
	args  []any
	hdr   []byte
	idx   []int
	// A Cluster's batch (runNodes): per master, its requests' batch; and
	// the requests sent as their own FCALLs.
	nodes  []*nodeBatch
	single []int
}

// run sends the batch's live requests and sets their replies. On a single
// Redis (not a Cluster) two or more requests go as one FCALL of the batch
// function (runBatch), which makes each of them as its own FCALL would;
// otherwise they go as one pipeline of FCALLs (each its own atomic call).
// When Redis does not have the function, it loads it and sends the failed
// calls again (they did not run).
func (s *Store) run(d *dispatcher) {
	// The batch lives until its latest caller's deadline, and at least
	// lateReplyWait (a reply that comes after its caller gave up is read
	// and compensated), with none when a caller has none (go-redis' read
	// and write timeouts still apply). Not the callers' cancellation: one
	// caller giving up must not fail the others' calls. The deadline is a
	// real one (Done closes), so that a dial's retry backoff or a wait for a
	// pooled connection ends with it.
	ctx := context.Background()
	var latest time.Time
	for _, r := range d.batch {
		if err := r.ctx.Err(); err != nil {
			continue
		}
		dl, ok := r.ctx.Deadline()
		if !ok {
			latest = time.Time{}
			break
		}
		if dl.After(latest) {
			latest = dl
		}
	}
	if !latest.IsZero() {
		var cancel context.CancelFunc
		if late := time.Now().Add(lateReplyWait); late.After(latest) {
			latest = late
		}
		ctx, cancel = context.WithDeadline(ctx, latest)
		defer cancel()
	}
	d.sent = d.sent[:0]
	live := 0
	for _, r := range d.batch {
		sent := r.ctx.Err() == nil && r.state.CompareAndSwap(reqQueued, reqSent)
		if !sent {
			// Its caller has gone: not sent.
			r.err = fmt.Errorf("redisstore: %w: %w", store.ErrNotSent, context.Cause(r.ctx))
		} else {
			live++
		}
		d.sent = append(d.sent, sent)
	}
	// The batch is pending until its replies are read and the refunds of
	// the late ones queued (Settle).
	s.busy.add(1)
	defer s.busy.add(-1)
	switch {
	case live >= 2 && !s.cluster:
		s.runBatch(ctx, d)
	case live >= 2 && s.nodes != nil:
		s.runNodes(ctx, d)
	case live > 0:
		s.runPipeline(ctx, d)
	}
	var late [][]any
	for i, r := range d.batch {
		if !d.sent[i] {
			continue
		}
		if r.err != nil {
			var re redis.Error
			if r.state.Load() == reqAbandoned && !errors.As(r.err, &re) && !errors.Is(r.err, store.ErrReplied) {
				// Its caller gave up and no reply came: it may have
				// been applied, and cannot be given back.
				s.late.lost.Add(1)
			}
			continue
		}
		s.replies.Add(1)
		s.shardReplied(ctx, r.args)
		if !r.state.CompareAndSwap(reqSent, reqAnswered) {
			// Its caller gave up after it was sent.
			if c := s.lateGiveBack(r); c != nil {
				late = append(late, c)
			}
		}
	}
	if len(late) > 0 {
		// The refunds go on the refunder's own round trip: the calls
		// queued behind this batch must not wait for it. When the
		// refunder is that far behind, the dispatcher sends them itself.
		s.busy.add(1)
		select {
		case s.refunds <- late:
		default:
			s.compensate(late)
			s.busy.add(-1)
		}
	}
}

// refundQueue bounds the batches of refunds waiting for the refunder.
const refundQueue = 64

// refunder sends the refunds the dispatchers queue (compensate) until
// Close closes the queue once the dispatchers have returned: those queued
// by then are sent too (on a closed client, they fail and are counted).
func (s *Store) refunder() {
	defer s.rwg.Done()
	for calls := range s.refunds {
		s.compensate(calls)
		s.busy.add(-1)
	}
}

// runPipeline sends the sent requests of d as one pipeline of FCALLs and
// sets their replies.
func (s *Store) runPipeline(ctx context.Context, d *dispatcher) {
	d.idx = d.idx[:0]
	for i := range d.batch {
		if d.sent[i] {
			d.idx = append(d.idx, i)
		}
	}
	s.pipeline(ctx, d, d.idx)
}

// runBatch sends the sent requests of d as one FCALL of the batch function
// and sets their replies, or their errors.
func (s *Store) runBatch(ctx context.Context, d *dispatcher) {
	d.batchArgs()
	var res string
	err := lib.Run(ctx, s.c, func() (err error) {
		res, err = s.c.Do(ctx, d.args...).Text()
		return err
	})
	if err == nil {
		d.idx = d.idx[:0]
		for i := range d.batch {
			if d.sent[i] {
				d.idx = append(d.idx, i)
			}
		}
		err = d.splitBatch(res, d.idx)
	}
	if err != nil {
		for i, r := range d.batch {
			if d.sent[i] {
				r.err = fmt.Errorf("redisstore: %w", err)
			}
		}
	}
}

// batchArgs sets d.args to the batch function's FCALL of the sent requests
// (each an FCALL of the decide function: its name, the number of keys, the
// keys, the arguments): the keys one after another, then ARGV[1] (d.hdr:
// the number of calls, then per call its numbers of keys and of arguments)
// and the arguments one after another.
func (d *dispatcher) batchArgs() {
	args, hdr := append(d.args[:0], fcallName, batchNameArg, 0), appendF64(d.hdr[:0], 0)
	nc, nk := 0, 0
	for i, r := range d.batch {
		if !d.sent[i] {
			continue
		}
		k := r.args[2].(int)
		args = append(args, r.args[3:3+k]...)
		hdr = appendF64(appendF64(hdr, int64(k)), int64(len(r.args)-3-k))
		nc, nk = nc+1, nk+k
	}
	putF64at(hdr, 0, int64(nc))
	args[2] = nk
	args = append(args, hdr)
	for i, r := range d.batch {
		if d.sent[i] {
			args = append(args, r.args[3+r.args[2].(int):]...)
		}
	}
	d.args, d.hdr = args, hdr
}

// wrapReply wraps the error of a call: with store.ErrReplied as well when
// it is Redis' answer about the call's data (a key of another type, an
// error raised in the function), which says Redis is up; not for the
// replies that say it cannot serve (LOADING, READONLY, CLUSTERDOWN, OOM…).
func wrapReply(err error) error {
	var re redis.Error
	if errors.As(err, &re) {
		msg := re.Error()
		if strings.HasPrefix(msg, "WRONGTYPE") || strings.Contains(msg, "@user_function") {
			return fmt.Errorf("redisstore: %w: %w", store.ErrReplied, err)
		}
	}
	return fmt.Errorf("redisstore: %w", err)
}

// errBatchReply is a batch reply that does not hold one reply per call.
var errBatchReply = errors.New("malformed batch reply")

// splitBatch sets the reply, or the error, of the requests d.batch[i] for i
// in idx from res, the reply of the batch function (or of the Cluster
// node's, which may answer errNotRun).
func (d *dispatcher) splitBatch(res string, idx []int) error {
	rest := res
	for _, i := range idx {
		r := d.batch[i]
		if len(rest) < 8 {
			return errBatchReply
		}
		n := f64at([]byte(rest[:8]), 0)
		rest = rest[8:]
		l := max(n, -n)
		if l > int64(len(rest)) {
			return errBatchReply
		}
		if n < 0 && strings.HasPrefix(rest[:l], notRunPrefix) {
			// Not made: the node does not serve its slot (fxbatch).
			r.err = errNotRun
		} else if n < 0 {
			// The call's own error inside the batch function (its pcall):
			// Redis answered.
			r.err = fmt.Errorf("redisstore: %w: %s", store.ErrReplied, rest[:l])
		} else {
			r.res = rest[:l]
		}
		rest = rest[l:]
	}
	if rest != "" {
		return errBatchReply
	}
	return nil
}

// compensate sends the give-backs (lateGiveBack: undos, refunds, or a
// reservation's give-back) of calls that were applied after their callers
// gave up, so that Redis does not count hits nobody was told were granted
// (the caller's failure mode decided instead).
func (s *Store) compensate(calls [][]any) {
	ctx, cancel := context.WithTimeout(context.Background(), lateReplyWait)
	defer cancel()
	given, failed := s.giveBack(ctx, calls)
	s.late.given.Add(uint64(given))
	s.late.failed.Add(uint64(failed))
}

// giveBack sends the give-back FCALLs calls in one pipeline and counts
// those applied and those that failed. A give-back that found a key locked
// (on a Cluster, by another process's two-step call: mode checked answers
// busy and writes nothing) or met a slot being migrated (TRYAGAIN, which
// did not run) is sent again after wait's backoff, as Decide retries its
// own calls, until it is applied, fails otherwise, or ctx or the attempts
// run out. A master that lost the library (restarted empty) gets it again
// once, as fcall's calls do.
func (s *Store) giveBack(ctx context.Context, calls [][]any) (given, failed int) {
	load := 0 // the library: 0 not loaded here, 1 loaded, -1 failed to load
	for attempt := 0; len(calls) > 0; attempt++ {
		pipe := s.c.Pipeline()
		cmds := make([]*redis.Cmd, len(calls))
		for i, args := range calls {
			cmds[i] = redis.NewCmd(ctx, args...)
			_ = pipe.Process(ctx, cmds[i])
		}
		_, _ = pipe.Exec(ctx)
		var again [][]any
		for i, cmd := range cmds {
			res, err := cmd.Text()
			switch {
			case err == nil && len(res) >= 8 && f64at([]byte(res), 0) == statusDone:
				given++
			case (err == nil && len(res) >= 8 && f64at([]byte(res), 0) == statusBusy) || isTryAgain(err):
				again = append(again, calls[i])
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
				again = append(again, calls[i])
			default:
				failed++
			}
		}
		if len(again) > 0 && wait(ctx, attempt) != nil {
			return given, failed + len(again)
		}
		calls = again
	}
	return given, failed
}

// Header layout of ARGV[1] (apply.lua): six doubles (mode, now, maxTTL,
// lockTTL, nk, n), then six per item (state key, global key, policy, hits,
// min, flags), then the plan, two per item (leader, global leader), and a
// reservation's offset (one more double) if any; the undo mode has no
// plan. A reply: status and now, then nine doubles per item, of which the
// first is its flags (replyOK, replyBurst) and the second Granted.
const (
	replyHead, replyItem = 2, 9
	replyOK, replyBurst  = 1, 2
)

func f64at(b []byte, i int) int64 {
	return int64(math.Float64frombits(binary.BigEndian.Uint64(b[8*i:])))
}

func putF64at(b []byte, i int, v int64) {
	binary.BigEndian.PutUint64(b[8*i:], math.Float64bits(float64(v)))
}

// lateGiveBack is the FCALL that gives back what the call of r granted,
// whose caller gave up after it was sent (a late reply), nil for none: a
// reservation's (r.resv: reservedBack) or any other call's (compensation).
func (s *Store) lateGiveBack(r *request) []any {
	if r.resv != nil {
		return s.reservedBack(r.args, r.res, r.resv)
	}
	return compensation(r.args, r.res, r.undo)
}

// reservation is what a reservation's late reply is given back from: its
// items (a copy) and their policies' encoding instant (call.prepare's).
type reservation struct {
	items []store.Item
	now   time.Time
}

// lateDecision returns the parts of a late reply's call that its give-back
// reads: the number of keys, the header, the reply, the number of items
// and the offset after the plan (0: none; above 0 a reservation's, below 0
// a give-back's instant). ok is false when there is nothing to give back
// or no way to: not a plain decision (the two-step's modes), a call that
// met a lock (status busy), a malformed header or reply, an item that is a
// refund (a call holding a refund already, or a reservation's give-back,
// which was applied: what was asked).
func lateDecision(args []any, res string) (nk int, hdr, rb []byte, n int, off int64, ok bool) {
	if len(args) < 4 || len(res) < 8*replyHead {
		return 0, nil, nil, 0, 0, false
	}
	nk, ok = args[2].(int)
	if !ok || len(args) < 5+nk {
		return 0, nil, nil, 0, 0, false
	}
	hdr, ok = args[3+nk].([]byte)
	if !ok || len(hdr) < 8*hdrFields {
		return 0, nil, nil, 0, 0, false
	}
	rb = []byte(res)
	mode, n := f64at(hdr, 0), int(f64at(hdr, 5))
	plain := hdrFields + (itemFields+planFields)*n
	if (mode != modeDecide && mode != modeChecked) || f64at(rb, 0) != statusDone ||
		n < 0 || (len(hdr) != 8*plain && len(hdr) != 8*(plain+1)) || len(rb) < 8*(replyHead+replyItem*n) {
		return 0, nil, nil, 0, 0, false
	}
	if len(hdr) == 8*(plain+1) {
		off = f64at(hdr, plain)
	}
	for i := range n {
		if f64at(hdr, hdrFields+itemFields*i+5)&flagRefund != 0 {
			return 0, nil, nil, 0, 0, false
		}
	}
	return nk, hdr, rb, n, off, true
}

// reservedBack is the give-back of a reservation's late reply (args, res;
// v its items): what Store.GiveBack sends for the engine's give-back of a
// wait its caller left (store.Reserved of the reply's decisions, at the
// reply's instant, the reservation's grant instant), made by the same code
// (call.prepare, call.command), at the reservation's present (its header's
// now: Redis's clock, or the caller's instant of the reservation, the
// latest the store was told of). It is nil when the reservation was
// rejected (it committed nothing), when it granted nothing, when the
// guards of compensation (lateDecision) say so, or when v's items do not
// make the header that was sent.
func (s *Store) reservedBack(args []any, res string, v *reservation) []any {
	_, hdr, _, n, off, ok := lateDecision(args, res)
	if !ok || off <= 0 || n != len(v.items) {
		return nil
	}
	mode, t := int(f64at(hdr, 0)), f64at(hdr, 1)
	c := s.calls.Get().(*call)
	defer s.put(c)
	c.prepare(s, v.items, v.now)
	c.off = off
	c.command(s, v.items, -1, mode, t, "")
	if !bytes.Equal(c.hdr, hdr) {
		return nil
	}
	out := make([]tiers.Decision, n)
	st, at, err := c.read(res, v.items, out)
	if err != nil || st != statusDone {
		return nil
	}
	back, _ := store.GiveBackItems(store.Reserved(v.items, out))
	if len(back) == 0 {
		return nil
	}
	c.prepare(s, back, v.now)
	c.off = -at
	c.command(s, back, -1, mode, t, "")
	cmd := slices.Clone(c.args)
	cmd[3+len(c.keys)] = slices.Clone(c.hdr)
	return cmd
}

// compensation is the FCALL that gives back what a decision call granted,
// for a call whose caller gave up after it was sent (a late reply), at the
// instant the call used (its reply's). It is nil when nothing was granted,
// when the call was not a plain decision (the two-step's modes, a call
// that met a lock, a reservation, which reservedBack gives back from its
// items, or a reservation's give-back, which was applied) or held a refund
// already.
//
// When exact (every take item of the call is undoableTake: call.undo), it
// is the undo that oneTrip sends (mode undo, appendUndoHead): each item's
// grant taken back from where it went, the count of its own fixed window,
// the bucket of a tier's logs that starts where the call's instant's
// bucket starts, so that the calls applied since keep their hits where
// they are. That is exact on Redis's clock, which does not go back on a
// master, and on a caller's clock as long as it does not go back across a
// bucket's start between the calls on a key (a grant then joins a newer
// bucket, whose hits stay counted until they leave the window: only ever
// less granted). Otherwise every item is a refund of the hits it was
// granted (tiers.Refund: the newest hits of the current tier, whichever
// call added them), on the same keys and policies.
func compensation(args []any, res string, exact bool) []any {
	nk, hdr, rb, n, off, ok := lateDecision(args, res)
	if !ok || off != 0 {
		// A reservation is given back from its items (reservedBack).
		return nil
	}
	for i := range n {
		if f64at(rb, replyHead+replyItem*i)&replyOK == 0 && f64at(hdr, hdrFields+itemFields*i+5)&flagShadow == 0 {
			// A rejected call committed nothing but its post-paid groups'
			// debits (store.Apply, step 3): its other items' grants are
			// predictions, and giving them back would take away hits of
			// other calls. The post-paid grants stay counted (the
			// caller's failure mode answered instead): under-grants only.
			return nil
		}
	}
	// A now below -1 is Redis's clock plus an offset (apply.lua): not the
	// instant of a grant undo can find.
	exact = exact && f64at(hdr, 1) >= -1
	some := false
	for i := range n {
		at := hdrFields + itemFields*i
		if f64at(hdr, at+1) != 0 {
			exact = false // undoableTake has no global key
		}
		some = some || f64at(rb, replyHead+replyItem*i+1) > 0
	}
	if !some {
		return nil
	}
	if exact {
		return undoLate(args, nk, hdr, rb, n)
	}
	h := make([]byte, len(hdr))
	copy(h, hdr)
	putF64at(h, 1, f64at(rb, 1))
	for i := range n {
		at := hdrFields + itemFields*i
		granted := f64at(rb, replyHead+replyItem*i+1)
		putF64at(h, at+3, granted)
		putF64at(h, at+4, 0)
		putF64at(h, at+5, f64at(h, at+5)|flagRefund)
		// Refunds belong to no group: the plan of refunds is all zeros.
		at = hdrFields + itemFields*n + planFields*i
		putF64at(h, at, 0)
		putF64at(h, at+1, 0)
	}
	out := make([]any, len(args))
	copy(out, args)
	out[3+nk] = h
	return out
}

// undoLate is compensation's undo of the call args (nk keys, header hdr
// of n items) from its reply rb: per item granted (or that entered its
// tier), its grant at its state key and policy, at the reply's instant;
// the keys (the lock keys of mode checked, which undo does not read,
// included) and policies are the call's.
func undoLate(args []any, nk int, hdr, rb []byte, n int) []any {
	var items []byte
	m := 0
	for i := range n {
		at, rt := hdrFields+itemFields*i, replyHead+replyItem*i
		flags, granted := f64at(rb, rt), f64at(rb, rt+1)
		if flags&replyOK == 0 || (granted == 0 && flags&replyBurst == 0) {
			continue
		}
		items = appendUndoItem(items, int(f64at(hdr, at)), int(f64at(hdr, at+2)), granted, flags&replyBurst != 0)
		m++
	}
	// Not the newest bucket, even on a caller's clock: calls on the same
	// keys may have been applied since.
	h := append(appendUndoHead(make([]byte, 0, 8*hdrFields+len(items)), f64at(rb, 1), f64at(hdr, 2), false, int(f64at(hdr, 4)), m), items...)
	out := make([]any, len(args))
	copy(out, args)
	out[3+nk] = h
	return out
}
