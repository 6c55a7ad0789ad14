package redisstore

import (
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

	"github.com/charonlimit/charon/internal/store"
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
	// pols: the encodings of the policies of args, kept when its caller
	// gives up after it was sent, for its late reply's give-back (backFor).
	pols []*encoded
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
// it was sent is still read, and what it granted given back (backFor).
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
	r.args, r.ctx = c.args, ctx
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
		cause = store.ErrClosed
	}
	if r.state.CompareAndSwap(reqQueued, reqAbandoned) {
		// Still in the queue: the dispatcher will not send it.
		c.detach()
		if cause == store.ErrClosed {
			return "", cause
		}
		return "", s.notSent(cause, mark)
	}
	// Its late reply is given back from what it sent: its command and its
	// policies, kept before the dispatcher can see the call abandoned.
	r.pols = slices.Clone(c.pols)
	if r.state.CompareAndSwap(reqSent, reqAbandoned) {
		// Sent: if it is applied, the dispatcher gives back what it
		// granted when its reply comes (backFor).
		c.detach()
		if cause == store.ErrClosed {
			return "", cause
		}
		return "", fmt.Errorf("redisstore: %w", cause)
	}
	r.pols = nil
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
// tells whether batch[i] was sent, idx holds the i of those sent, cmds[i]
// is a command in a pipeline of FCALLs, args and hdr the command and
// ARGV[1] of a batch call.
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
	// and given back), with none when a caller has none (go-redis' read
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
	d.sent, d.idx = d.sent[:0], d.idx[:0]
	for i, r := range d.batch {
		sent := r.ctx.Err() == nil && r.state.CompareAndSwap(reqQueued, reqSent)
		if !sent {
			// Its caller has gone: not sent.
			r.err = fmt.Errorf("redisstore: %w: %w", store.ErrNotSent, context.Cause(r.ctx))
		} else {
			d.idx = append(d.idx, i)
		}
		d.sent = append(d.sent, sent)
	}
	live := len(d.idx)
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
	var late []lateReply
	for i, r := range d.batch {
		if !d.sent[i] {
			continue
		}
		if r.err != nil {
			var re redis.Error
			if r.state.Load() == reqAbandoned && !errors.As(r.err, &re) && !errors.Is(r.err, store.ErrReplied) {
				// Its caller gave up and no reply came: it may have
				// been applied, and cannot be given back.
				s.lost.Add(1)
			}
			continue
		}
		s.replies.Add(1)
		s.shardReplied(ctx, r.args)
		if !r.state.CompareAndSwap(reqSent, reqAnswered) {
			// Its caller gave up after it was sent: the dispatcher owns
			// the request now.
			late = append(late, lateReply{args: r.args, pols: r.pols, res: r.res})
			r.pols = nil
		}
	}
	if len(late) > 0 {
		// The give-backs go on the refunder's own round trip: the calls
		// queued behind this batch must not wait for it. When the
		// refunder is that far behind, the dispatcher sends them itself.
		s.busy.add(1)
		select {
		case s.refunds <- late:
		default:
			s.giveBackLate(late)
			s.busy.add(-1)
		}
	}
}

// refundQueue bounds the batches of late replies waiting for the refunder.
const refundQueue = 64

// refunder gives back the late replies the dispatchers queue (giveBackLate)
// until Close closes the queue once the dispatchers have returned: those
// queued by then are given back too (on a closed client, they fail and
// are counted).
func (s *Store) refunder() {
	defer s.rwg.Done()
	for late := range s.refunds {
		s.giveBackLate(late)
		s.busy.add(-1)
	}
}

// runPipeline sends the sent requests of d as one pipeline of FCALLs and
// sets their replies.
func (s *Store) runPipeline(ctx context.Context, d *dispatcher) {
	s.pipeline(ctx, d, d.idx)
}

// runBatch sends the sent requests of d as one FCALL of the batch function
// and sets their replies, or their errors.
func (s *Store) runBatch(ctx context.Context, d *dispatcher) {
	d.args, d.hdr = batchCall(d.args, d.hdr, batchNameArg, d.batch, d.idx)
	if err := s.sendBatch(ctx, s.c, d.args, d, d.idx); err != nil {
		for _, i := range d.idx {
			d.batch[i].err = fmt.Errorf("redisstore: %w", err)
		}
	}
}

// sendBatch sends args, the FCALL of a batch function making the requests
// idx of d, through c (loading the library first when Redis lacks it), and
// sets their replies, or their errors, from its reply. It returns the error
// of the batch as a whole.
func (s *Store) sendBatch(ctx context.Context, c interface {
	Do(context.Context, ...any) *redis.Cmd
}, args []any, d *dispatcher, idx []int) error {
	var res string
	err := lib.Run(ctx, s.c, func() (err error) {
		res, err = c.Do(ctx, args...).Text()
		return err
	})
	if err != nil {
		return err
	}
	return d.splitBatch(res, idx)
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

func f64at(b []byte, i int) int64 {
	return int64(math.Float64frombits(binary.BigEndian.Uint64(b[8*i:])))
}
