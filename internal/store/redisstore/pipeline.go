package redisstore

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/charonlimit/charon/internal/redisfunc"
	"github.com/charonlimit/charon/internal/store"
)

// maxBatch caps the FCALLs of one pipeline.
const maxBatch = 128

// DefaultPipelines is the default of Options.Pipelines.
const DefaultPipelines = 2

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
	// state decides, once per send, between the dispatcher sending the
	// FCALL (reqSent) and its caller giving up first (reqAbandoned).
	state atomic.Int32
}

const (
	reqQueued int32 = iota
	reqSent
	reqAbandoned
)

// send hands the FCALL c.args to a dispatcher and waits for its reply,
// the caller's context or Close. A caller that stops waiting detaches its
// request and the buffers the command points into (c.args, c.hdr), so
// that c can be reused while the dispatcher still sends them.
func (s *Store) send(ctx context.Context, c *call) (string, error) {
	r := c.req
	if r == nil {
		r = &request{done: make(chan struct{}, 1)}
		c.req = r
	}
	r.args, r.ctx = c.args, ctx
	r.state.Store(reqQueued)
	select {
	case s.q <- r:
	case <-ctx.Done():
		r.args, r.ctx = nil, nil
		return "", fmt.Errorf("redisstore: %w: %w", store.ErrNotSent, ctx.Err())
	case <-s.stop:
		r.args, r.ctx = nil, nil
		return "", store.ErrClosed
	}
	select {
	case <-r.done:
		res, err := r.res, r.err
		r.args, r.ctx, r.res, r.err = nil, nil, "", nil
		return res, err
	case <-ctx.Done():
		c.detach()
		if r.state.CompareAndSwap(reqQueued, reqAbandoned) {
			// Still in the queue: the dispatcher will not send it.
			return "", fmt.Errorf("redisstore: %w: %w", store.ErrNotSent, ctx.Err())
		}
		return "", fmt.Errorf("redisstore: %w", ctx.Err())
	case <-s.stop:
		c.detach()
		return "", store.ErrClosed
	}
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
	batch := make([]*request, 0, maxBatch)
	cmds := make([]*redis.Cmd, 0, maxBatch)
	retry := make([]int, 0, maxBatch)
	for {
		select {
		case r := <-s.q:
			batch = append(batch[:0], r)
		case <-s.stop:
			return
		}
	fill:
		for len(batch) < maxBatch {
			select {
			case r := <-s.q:
				batch = append(batch, r)
			default:
				break fill
			}
		}
		cmds, retry = s.run(batch, cmds[:0], retry[:0])
		for _, r := range batch {
			r.done <- struct{}{}
		}
		clear(batch)
		clear(cmds)
	}
}

// run sends the batch's live requests as one pipeline and sets their
// replies. When Redis does not have the function, it loads it and sends
// the failed calls again (they did not run).
func (s *Store) run(batch []*request, cmds []*redis.Cmd, retry []int) ([]*redis.Cmd, []int) {
	// The batch lives until its latest caller's deadline, with none when a
	// caller has none (go-redis' read and write timeouts still apply). Not
	// the callers' cancellation: one caller giving up must not fail the
	// others' calls. The deadline is a real one (Done closes), so that a
	// dial's retry backoff or a wait for a pooled connection ends with it.
	ctx := context.Background()
	var latest time.Time
	for _, r := range batch {
		if err := r.ctx.Err(); err != nil {
			continue
		}
		d, ok := r.ctx.Deadline()
		if !ok {
			latest = time.Time{}
			break
		}
		if d.After(latest) {
			latest = d
		}
	}
	if !latest.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, latest)
		defer cancel()
	}
	pipe := s.c.Pipeline()
	for _, r := range batch {
		var cmd *redis.Cmd
		if err := r.ctx.Err(); err != nil || !r.state.CompareAndSwap(reqQueued, reqSent) {
			// Its caller has gone: not sent.
			r.err = fmt.Errorf("redisstore: %w: %w", store.ErrNotSent, context.Cause(r.ctx))
		} else {
			cmd = redis.NewCmd(ctx, r.args...)
			_ = pipe.Process(ctx, cmd)
		}
		cmds = append(cmds, cmd)
	}
	if pipe.Len() > 0 {
		_, _ = pipe.Exec(ctx)
	}
	for i, cmd := range cmds {
		if cmd != nil && redisfunc.IsNotFound(cmd.Err()) {
			retry = append(retry, i)
		}
	}
	if len(retry) > 0 {
		if err := s.Load(ctx); err != nil {
			for _, i := range retry {
				batch[i].err = err
				cmds[i] = nil
			}
		} else {
			pipe := s.c.Pipeline()
			for _, i := range retry {
				cmds[i] = redis.NewCmd(ctx, batch[i].args...)
				_ = pipe.Process(ctx, cmds[i])
			}
			_, _ = pipe.Exec(ctx)
		}
	}
	for i, cmd := range cmds {
		if cmd == nil {
			continue
		}
		res, err := cmd.Text()
		if err != nil {
			batch[i].err = fmt.Errorf("redisstore: %w", err)
			continue
		}
		batch[i].res = res
	}
	return cmds, retry
}
