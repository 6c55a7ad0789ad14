package rls

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/charonlimit/charon/internal/decisionlog"
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/internal/offenders"
)

// Observer is told of every decided ShouldRateLimit request (gRPC or
// /json) once its answer is built: the descriptor metrics, the decision
// log, the top offenders and the candidate configuration are observers.
// Observe must change neither req nor resp, and must not keep them past its
// return unless it owns them from then on (the service builds both afresh
// for each request and never touches them after the observers). Observe
// runs on the request's goroutine: one that may be slow is run through
// newBackground, off the request path.
type Observer interface {
	Observe(ctx context.Context, req *engine.Request, resp *engine.Response)
}

// observerFunc is a function as an Observer.
type observerFunc func(ctx context.Context, req *engine.Request, resp *engine.Response)

func (f observerFunc) Observe(ctx context.Context, req *engine.Request, resp *engine.Response) {
	f(ctx, req, resp)
}

// observersOf are the service's observers of its options, in order: the
// cheap ones inline, the candidate in the background.
func (s *Service) observersOf() []Observer {
	obs := []Observer{observerFunc(func(_ context.Context, req *engine.Request, resp *engine.Response) {
		s.metrics.countDescriptors(req, resp)
	})}
	if l := s.opts.DecisionLog; l != nil {
		obs = append(obs, decisionLogObserver{l})
	}
	if t := s.top; t != nil {
		obs = append(obs, topObserver{t})
	}
	if s.candidate != nil {
		obs = append(obs, s.candidate)
	}
	return obs
}

// decisionLogObserver writes each decision to the decision log (which
// buffers: a write never waits for the disk).
type decisionLogObserver struct{ l *decisionlog.Logger }

func (o decisionLogObserver) Observe(_ context.Context, req *engine.Request, resp *engine.Response) {
	logDecisions(o.l, resp.Now, req, resp)
}

// topObserver counts who is limited, at the decision's instant.
type topObserver struct{ t *offenders.Tracker }

func (o topObserver) Observe(_ context.Context, req *engine.Request, resp *engine.Response) {
	observeOffenders(o.t, resp.Now, req, resp)
}

// candidateQueue bounds the requests waiting for the candidate: past it a
// request is not decided under the candidate (counted), never held.
const candidateQueue = 4096

// background runs an Observer on a goroutine of its own, fed by a bounded
// queue: the request that is observed never waits for it. When the queue
// is full an observation is dropped and counted. Run it with run, which
// drains the queue once its context ends. Safe for concurrent use.
type background struct {
	o       Observer
	q       chan observation
	dropped atomic.Uint64
	// pending counts observations queued or being observed.
	pending atomic.Int64
}

// observation is one request and its answer, with the time its caller
// had left (0: no deadline), so that the observer judges it with the
// caller's deadline, not the time spent in the queue.
type observation struct {
	req  *engine.Request
	resp *engine.Response
	left time.Duration
}

func newBackground(o Observer, size int) *background {
	return &background{o: o, q: make(chan observation, size)}
}

// Observe queues the observation, or drops it when the queue is full.
func (b *background) Observe(ctx context.Context, req *engine.Request, resp *engine.Response) {
	ob := observation{req: req, resp: resp}
	if dl, ok := ctx.Deadline(); ok {
		ob.left = max(time.Until(dl), time.Nanosecond)
	}
	b.pending.Add(1)
	select {
	case b.q <- ob:
	default:
		b.pending.Add(-1)
		b.dropped.Add(1)
	}
}

// run observes the queued observations until ctx ends (the server ends it
// once nothing more is decided), then the ones still queued.
func (b *background) run(ctx context.Context) {
	for {
		select {
		case ob := <-b.q:
			b.observe(ob)
		case <-ctx.Done():
			for {
				select {
				case ob := <-b.q:
					b.observe(ob)
				default:
					return
				}
			}
		}
	}
}

func (b *background) observe(ob observation) {
	defer b.pending.Add(-1)
	ctx, cancel := context.Background(), context.CancelFunc(func() {})
	if ob.left > 0 {
		ctx, cancel = context.WithTimeout(ctx, ob.left)
	}
	defer cancel()
	b.o.Observe(ctx, ob.req, ob.resp)
}

// Dropped returns the observations dropped for a full queue.
func (b *background) Dropped() uint64 { return b.dropped.Load() }

// Pending returns the observations queued or being observed.
func (b *background) Pending() int64 { return b.pending.Load() }
