package redistest

import (
	"context"
	"net"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// Hook is the go-redis hook of tests, scripted by its functions: each one
// that is set runs in place of the step it names and calls next itself (or
// does not: a dropped reply, a refused dial). It counts what the client
// did: dials (and those that failed), commands sent alone, and pipelines.
// Add it with a client's AddHook; the counters are safe for concurrent use,
// and the functions must be when the client is used concurrently.
//
// With a *redis.ClusterClient the hook sees the commands of the Cluster
// client (before they are split by node) and not the nodes' dials.
type Hook struct {
	// Dial replaces a dial.
	Dial func(ctx context.Context, network, addr string, next redis.DialHook) (net.Conn, error)
	// Process replaces a command sent alone (with go-redis' retries of it
	// inside next).
	Process func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error
	// Pipeline replaces a pipeline.
	Pipeline func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error
	// Each is called with every command, alone or in a pipeline, before
	// Process or Pipeline.
	Each func(cmd redis.Cmder)

	dials, dialErrs, cmds, pipes atomic.Int64
}

var _ redis.Hook = (*Hook)(nil)

// Dials returns the dials the client attempted, and how many of them
// failed.
func (h *Hook) Dials() (attempted, failed int64) { return h.dials.Load(), h.dialErrs.Load() }

// Sent returns the commands the client sent alone (a command that go-redis
// retries counts once) and its pipelines.
func (h *Hook) Sent() (commands, pipelines int64) { return h.cmds.Load(), h.pipes.Load() }

// DialHook implements redis.Hook.
func (h *Hook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		h.dials.Add(1)
		var (
			c   net.Conn
			err error
		)
		if h.Dial != nil {
			c, err = h.Dial(ctx, network, addr, next)
		} else {
			c, err = next(ctx, network, addr)
		}
		if err != nil {
			h.dialErrs.Add(1)
		}
		return c, err
	}
}

// ProcessHook implements redis.Hook.
func (h *Hook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.cmds.Add(1)
		if h.Each != nil {
			h.Each(cmd)
		}
		if h.Process != nil {
			return h.Process(ctx, cmd, next)
		}
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook implements redis.Hook.
func (h *Hook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.pipes.Add(1)
		if h.Each != nil {
			for _, cmd := range cmds {
				h.Each(cmd)
			}
		}
		if h.Pipeline != nil {
			return h.Pipeline(ctx, cmds, next)
		}
		return next(ctx, cmds)
	}
}
