package periodic

import (
	"sync"
	"time"
)

// Loop is a running loop; Stop ends it. A nil *Loop stands for no loop:
// Stop does nothing.
type Loop struct {
	stop, done chan struct{}
	once       sync.Once
}

// Start calls fn every interval, which must be positive, until Stop. The
// calls are sequential; one that takes longer than interval delays the next
// rather than overlapping it.
func Start(interval time.Duration, fn func()) *Loop {
	l := &Loop{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-l.stop:
				return
			case <-t.C:
				fn()
			}
		}
	}()
	return l
}

// Sweep starts a store's sweeper: sweep(now()) every interval, now being
// time.Now when nil. It returns nil, no loop, when interval is not
// positive.
func Sweep(interval time.Duration, now func() time.Time, sweep func(now time.Time)) *Loop {
	if interval <= 0 {
		return nil
	}
	if now == nil {
		now = time.Now
	}
	return Start(interval, func() { sweep(now()) })
}

// Stop ends the loop and waits for a call in progress to return; fn is not
// called afterwards. Safe for concurrent use, and to call more than once.
func (l *Loop) Stop() {
	if l == nil {
		return
	}
	l.once.Do(func() {
		close(l.stop)
		<-l.done
	})
}
