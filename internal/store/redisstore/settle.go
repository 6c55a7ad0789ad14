package redisstore

import (
	"context"
	"sync"
)

// pending counts the work of a Store that outlives the calls that made it:
// the dispatchers' batches in flight (whose replies may be late ones, to be
// given back), the refunds queued or being sent, and the background
// releases of the two-step. Settle waits for it to reach zero.
type pending struct {
	mu   sync.Mutex
	n    int64
	idle chan struct{} // closed when n reaches 0; nil when nobody waits
}

func (p *pending) add(d int64) {
	p.mu.Lock()
	p.n += d
	if p.n == 0 && p.idle != nil {
		close(p.idle)
		p.idle = nil
	}
	p.mu.Unlock()
}

// wait returns when n is zero, or ctx's error.
func (p *pending) wait(ctx context.Context) error {
	p.mu.Lock()
	if p.n == 0 {
		p.mu.Unlock()
		return nil
	}
	if p.idle == nil {
		p.idle = make(chan struct{})
	}
	idle := p.idle
	p.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Settle returns once nothing the store sent is pending: no batch of the
// dispatchers in flight (so every late reply has been read, or its wait
// for it has ended: LateLost), no refund of a late grant queued or being
// sent, no background release of a two-step's locks. It returns ctx's
// error if that comes first. Calls made meanwhile delay it: a caller
// stops its own calls first. Tests use it to wait for the store rather
// than for a duration; safe for concurrent use.
func (s *Store) Settle(ctx context.Context) error { return s.busy.wait(ctx) }

// joined is the goroutines a Store starts for work its callers do not wait
// for (background), which Close waits for.
type joined struct {
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

// background runs f, work its caller does not wait for (a give-back, a
// release), on its own goroutine, counted as pending work (Settle) and
// joined by Close; once Close has begun, on the caller's goroutine. f
// bounds its own time (lateReplyWait), and so Close's wait.
func (s *Store) background(f func()) {
	s.bg.mu.Lock()
	if s.bg.closed {
		s.bg.mu.Unlock()
		f()
		return
	}
	s.bg.wg.Add(1)
	s.busy.add(1)
	s.bg.mu.Unlock()
	go func() {
		defer s.bg.wg.Done()
		defer s.busy.add(-1)
		f()
	}()
}

// joinBackground waits for the goroutines background started; those it
// is asked for afterwards run on their callers' goroutines.
func (s *Store) joinBackground() {
	s.bg.mu.Lock()
	s.bg.closed = true
	s.bg.mu.Unlock()
	s.bg.wg.Wait()
}
